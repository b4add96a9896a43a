package broker

import (
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"
)

// A redelivery count set by another client, in whatever integer type, or
// nonsense, reads as a count or as none.
func TestRedeliveriesReadsAnyIntegerHeader(t *testing.T) {
	for _, c := range []struct {
		v    any
		want int64
	}{{int64(3), 3}, {int32(4), 4}, {int16(5), 5}, {int8(6), 6}, {uint8(7), 7}, {uint16(8), 8}, {int64(-2), 0}, {"9", 0}, {1.5, 0}, {nil, 0}} {
		if got := redeliveries(amqp.Table{HeaderRedeliveries: c.v}); got != c.want {
			t.Errorf("redeliveries(%T %v) = %d, want %d", c.v, c.v, got, c.want)
		}
	}
}
