package broker

import (
	"context"
	"fmt"
	"sync"

	amqp "github.com/rabbitmq/amqp091-go"
)

// QueueInspector reads queue depths on a channel of its own, reopened
// after an error (a passive declare of a missing queue closes the channel).
type QueueInspector struct {
	conn *Conn

	mu sync.Mutex
	ch *amqp.Channel
}

// NewQueueInspector returns an inspector over conn.
func NewQueueInspector(conn *Conn) *QueueInspector {
	return &QueueInspector{conn: conn}
}

// Ready returns how many messages wait in queue, ready for a consumer
// (messages handed to a consumer and not yet acked are not counted).
func (q *QueueInspector) Ready(ctx context.Context, queue string) (int, error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.ch == nil || q.ch.IsClosed() {
		ch, err := q.conn.Channel(ctx)
		if err != nil {
			return 0, err
		}
		q.ch = ch
	}
	info, err := q.ch.QueueDeclarePassive(queue, true, false, false, false, nil)
	if err != nil {
		q.ch.Close()
		q.ch = nil
		return 0, fmt.Errorf("inspect queue %s: %w", queue, err)
	}
	return info.Messages, nil
}

// Close closes the inspector's channel.
func (q *QueueInspector) Close() {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.ch != nil {
		q.ch.Close()
		q.ch = nil
	}
}
