package broker

import "github.com/prometheus/client_golang/prometheus"

// Metrics are the broker layer's Prometheus collectors.
type Metrics struct {
	connected    prometheus.Gauge
	reconnects   prometheus.Counter
	published    *prometheus.CounterVec
	deadLettered *prometheus.CounterVec
	consumed     *prometheus.CounterVec
	ackFrames    *prometheus.CounterVec
	panics       *prometheus.CounterVec
}

// NewMetrics creates the collectors and registers them on reg (nil: not
// registered, for tools that expose no metrics).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		connected: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "sas_broker_connected",
			Help: "1 while the RabbitMQ connection is up.",
		}),
		reconnects: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sas_broker_reconnects_total",
			Help: "RabbitMQ connections re-established after a drop.",
		}),
		published: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sas_broker_published_total",
			Help: "Messages published, by outcome (confirmed, returned, nacked, failed).",
		}, []string{"outcome"}),
		deadLettered: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sas_dead_lettered_total",
			Help: "Messages moved to a dead-letter queue, by input queue and reason.",
		}, []string{"queue", "reason"}),
		consumed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sas_broker_consumed_total",
			Help: "Deliveries handled, by queue and result (ack, requeue, dead_letter).",
		}, []string{"queue", "result"}),
		ackFrames: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sas_broker_ack_frames_total",
			Help: "Acks and nacks sent to RabbitMQ, by queue; one ack may settle many deliveries (compare sas_broker_consumed_total).",
		}, []string{"queue"}),
		panics: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sas_handler_panics_total",
			Help: "Message handlers that panicked, by queue: each message was dead-lettered (reason handler_panic) and the process went on.",
		}, []string{"queue"}),
	}
	for _, outcome := range []string{"confirmed", "returned", "nacked", "failed"} {
		m.published.WithLabelValues(outcome)
	}
	if reg != nil {
		reg.MustRegister(m.connected, m.reconnects, m.published, m.deadLettered, m.consumed, m.ackFrames, m.panics)
	}
	return m
}
