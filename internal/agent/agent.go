// Package agent is the agent service: it consumes StepRequests for the
// agent kinds it serves, calls the remote service with the step's stable
// idempotency key, retries transient faults within the step's complete-by
// time, and replies ok or failed. When the complete-by time passes it stops
// and sends nothing: by then the step may belong to another attempt.
package agent

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	amqp "github.com/rabbitmq/amqp091-go"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"sas/internal/broker"
	"sas/internal/contract"
	"sas/internal/failpoint"
	"sas/internal/messages"
	"sas/internal/secrets"
	"sas/internal/service"
	"sas/internal/tracing"
)

// Config is the agent's configuration (environment prefix SAS_).
type Config struct {
	service.Common
	service.WorkflowsFile
	MetricsAddr string `envconfig:"METRICS_ADDR" default:":9103"`
	// Kinds are the agent kinds this process serves.
	Kinds []string `envconfig:"AGENT_KINDS" default:"inventory,payment,shipping"`
	// Concurrency is how many requests of one kind are worked on at once.
	Concurrency int `envconfig:"AGENT_CONCURRENCY" default:"32"`
	// Prefetch is how many unacked requests of one kind the broker hands over.
	Prefetch int `envconfig:"AGENT_PREFETCH" default:"64"`
	// RemoteURL is the base URL of the remote service of every kind the
	// endpoints file does not name.
	RemoteURL string `envconfig:"REMOTE_URL" default:"http://127.0.0.1:9105"`
	// EndpointsFile is a YAML file giving each agent kind its own service:
	// base URL, paths per action, headers from a file or a variable, CA
	// file and call timeout (see docs/YOUR-PROCESS.md).
	EndpointsFile string `envconfig:"AGENT_ENDPOINTS_FILE"`
	// CallTimeout bounds one HTTP request (an endpoint may set its own).
	CallTimeout time.Duration `envconfig:"AGENT_CALL_TIMEOUT" default:"5s"`
	// SafetyMargin is kept free before complete_by: work that could not
	// end before complete_by minus this margin is not started.
	SafetyMargin time.Duration `envconfig:"AGENT_SAFETY_MARGIN" default:"100ms"`
	// RetryBase and RetryMax shape the backoff between retries.
	RetryBase time.Duration `envconfig:"AGENT_RETRY_BASE" default:"50ms"`
	RetryMax  time.Duration `envconfig:"AGENT_RETRY_MAX" default:"2s"`
	// BreakerFailures consecutive failures open an endpoint's circuit for
	// BreakerOpenFor.
	BreakerFailures int           `envconfig:"AGENT_BREAKER_FAILURES" default:"5"`
	BreakerOpenFor  time.Duration `envconfig:"AGENT_BREAKER_OPEN_FOR" default:"1s"`
	// MaxResponseBytes caps a remote answer, which becomes the step's
	// result and goes with every later step's request: a larger answer
	// (its numbers written out in full) fails the step for good. At most
	// messages.MaxResultBytes.
	MaxResponseBytes int64 `envconfig:"AGENT_MAX_RESPONSE_BYTES" default:"16384"`
}

// Check reports settings that cannot work.
func (c Config) Check() error {
	if err := c.Common.Check(); err != nil {
		return err
	}
	if c.MaxResponseBytes < 2 || c.MaxResponseBytes > messages.MaxResultBytes {
		return fmt.Errorf("SAS_AGENT_MAX_RESPONSE_BYTES %d is outside 2..%d (a result travels in every later request of its order)",
			c.MaxResponseBytes, messages.MaxResultBytes)
	}
	return nil
}

type metrics struct {
	requests     *prometheus.CounterVec
	calls        *prometheus.CounterVec
	retries      *prometheus.CounterVec
	abandoned    *prometheus.CounterVec
	callDuration *prometheus.HistogramVec
	circuit      *prometheus.GaugeVec
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sas_agent_requests_total",
			Help: "Step requests handled, by agent kind and result (ok, failed, accepted, abandoned, rejected, requeued).",
		}, []string{"kind", "result"}),
		calls: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sas_agent_calls_total",
			Help: "HTTP calls to the remote service, by endpoint and result (ok, permanent, transient, accepted).",
		}, []string{"endpoint", "result"}),
		retries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sas_agent_retries_total",
			Help: "Retries of remote calls, by endpoint and the fault that caused them.",
		}, []string{"endpoint", "reason"}),
		abandoned: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sas_agent_abandoned_total",
			Help: "Requests given up silently because complete_by came (expired_on_arrival, deadline).",
		}, []string{"reason"}),
		callDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "sas_agent_call_duration_seconds",
			Help:    "Duration of one HTTP call to the remote service.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16),
		}, []string{"endpoint"}),
		circuit: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "sas_agent_circuit_state",
			Help: "Circuit breaker state per remote endpoint: 0 closed, 1 half-open, 2 open.",
		}, []string{"endpoint"}),
	}
	reg.MustRegister(m.requests, m.calls, m.retries, m.abandoned, m.callDuration, m.circuit)
	return m
}

// initSeries makes every labelled series a rule or a dashboard panel reads
// exist from the start, at zero, for the kinds served and the endpoints
// (step names) they call.
func (m *metrics) initSeries(kinds, endpoints []string) {
	for _, kind := range kinds {
		for _, result := range []string{"ok", "failed", "accepted", "abandoned", "rejected", "requeued"} {
			m.requests.WithLabelValues(kind, result)
		}
	}
	for _, e := range endpoints {
		for _, result := range []string{"ok", "permanent", "transient", "accepted"} {
			m.calls.WithLabelValues(e, result)
		}
		for _, reason := range []string{"5xx", "429", "network", "timeout", "circuit_open"} {
			m.retries.WithLabelValues(e, reason)
		}
		m.callDuration.WithLabelValues(e)
		m.circuit.WithLabelValues(e)
	}
	for _, reason := range []string{"expired_on_arrival", "deadline"} {
		m.abandoned.WithLabelValues(reason)
	}
}

// Run runs the agent until ctx is done, then stops taking requests, lets
// those in hand finish (within cfg.ShutdownTimeout) and closes.
func Run(ctx context.Context, cfg Config, logger *slog.Logger) error {
	if len(cfg.Kinds) == 0 {
		return errors.New("no agent kinds configured (SAS_AGENT_KINDS)")
	}
	me := cfg.Instance("agent")
	logger = logger.With("service", "agent", "instance", me)
	reg := service.NewRegistry()
	m := newMetrics(reg)
	workflows, err := cfg.Workflows()
	if err != nil {
		return err
	}
	m.initSeries(cfg.Kinds, workflows.StepNames(cfg.Kinds...))
	endpoints, hidden, err := loadEndpoints(cfg)
	if err != nil {
		return err
	}
	redact := secrets.New(hidden...)
	logger = service.WithSecrets(logger, redact)

	inputs := []string{messages.RepliesQueue}
	for _, k := range cfg.Kinds {
		inputs = append(inputs, messages.RequestsQueue(k))
	}
	topo := broker.Topology{Prefix: cfg.QueuePrefix, DeliveryLimit: cfg.DeliveryLimit, QueueType: cfg.QueueType, Inputs: inputs}
	sk, err := service.Start(ctx, service.Setup{Name: "agent", Me: me, Common: cfg.Common, OpsAddr: cfg.MetricsAddr, Registry: reg,
		Topology: &topo, Traced: true, Redact: redact}, logger)
	if err != nil {
		return err
	}
	defer sk.Close()
	conn, pub, bm, tr := sk.Deps.Conn, sk.Deps.Pub, sk.Deps.Metrics, sk.Tracing
	workCtx := sk.WorkCtx
	a := &agent{
		cfg: cfg, topo: topo, pub: pub, logger: logger, metrics: m, workCtx: workCtx, now: time.Now,
		endpoints: endpoints, tr: tr, redact: redact,
		caller: &caller{cfg: cfg, metrics: m, now: time.Now, tr: tr, redact: redact}, throttleSent: map[string]time.Time{},
	}
	var consumers []*broker.Consumer
	for _, kind := range cfg.Kinds {
		consumers = append(consumers, broker.NewConsumer(conn, pub,
			broker.ConsumerConfig{Input: messages.RequestsQueue(kind), Prefetch: cfg.Prefetch, Workers: cfg.Concurrency, Reasons: messages.Reasons()},
			a.handler(kind), logger, bm))
	}

	for _, kind := range cfg.Kinds {
		logger.Info("agent kind served", "kind", kind, "url", endpoints[kind].base, "workflows", workflows.Source)
	}
	logger.Info("agent started", "kinds", cfg.Kinds, "concurrency", cfg.Concurrency)
	return sk.Run(ctx, cfg.ShutdownTimeout, sk.Deps.Ready(consumers...), consumersRun(consumers)...)
}

func consumersRun(cs []*broker.Consumer) []func(context.Context) error {
	out := make([]func(context.Context) error, len(cs))
	for i, c := range cs {
		out[i] = c.Run
	}
	return out
}

type agent struct {
	cfg       Config
	endpoints map[string]*endpoint
	topo      broker.Topology
	pub       *broker.Publisher
	caller    *caller
	logger    *slog.Logger
	metrics   *metrics
	workCtx   context.Context
	now       func() time.Time
	tr        *tracing.Tracing
	// redact hides the endpoints' secret header values, and credentials
	// of any kind, in what a reply carries: a service's answer is kept and
	// shown to every console viewer, and it may echo the request.
	redact *secrets.Redactor

	// throttleMu guards throttleSent: when this agent last told the
	// schedulers, by kind, that a service answered 429 (at most once a
	// second each: a burst of 429s is one piece of news).
	throttleMu   sync.Mutex
	throttleSent map[string]time.Time
}

// handler is the handler of kind's requests with its middleware:
// failpoints, the trace context, then the content type and the body
// decoded.
func (a *agent) handler(kind string) broker.Handler {
	return broker.Chain(broker.Decoded(messages.DecodeStepRequest,
		func(_ context.Context, _ broker.Message, err error) error { return a.reject(kind, err) },
		func(ctx context.Context, _ broker.Message, req messages.StepRequest) error {
			return a.handle(ctx, kind, req)
		}),
		broker.Failpoints(), broker.Traced(a.tr))
}

// handle works on one request. See broker.Handler for what its result
// means: nil acks, a Rejection dead-letters, an error requeues.
func (a *agent) handle(ctx context.Context, kind string, req messages.StepRequest) error {
	started := a.now()
	// The handling is a span of the order's trace, a child of the
	// scheduler's publish when the request carries the trace context; it
	// runs under workCtx, so SIGTERM lets the call finish.
	hctx, span := a.tr.Start(tracing.RemoteParent(a.workCtx, ctx), "handle "+req.Name, trace.WithSpanKind(trace.SpanKindConsumer))
	defer span.End()
	if a.tr.On() {
		span.SetAttributes(tracing.StepAttrs(req.OrderID, req.Step, req.Attempt, attribute.String("sas.agent", kind))...)
	}
	log := a.logger.With(append([]any{"order_id", req.OrderID, "step", req.Step, "attempt", req.Attempt, "name", req.Name},
		tracing.LogAttrs(hctx)...)...)
	// The agent's clock against the database's complete_by: a skew only
	// costs wasted or skipped work, because the database's fence decides
	// whether a reply counts.
	deadline := req.CompleteBy.Add(-a.cfg.SafetyMargin)
	if !a.now().Before(deadline) {
		a.metrics.abandoned.WithLabelValues("expired_on_arrival").Inc()
		a.metrics.requests.WithLabelValues(kind, "abandoned").Inc()
		span.AddEvent("past complete_by on arrival: dropped without reply")
		log.Info("request past its complete_by on arrival; dropped without reply")
		return nil
	}
	body, err := json.Marshal(contract.Request{OrderID: req.OrderID, Step: req.Step, Action: req.Name, Payload: req.Payload,
		Results: req.Results, Undoes: req.Undoes, UndoneResult: req.UndoneResult, Input: req.Input, Item: req.Item, Index: req.Index})
	if err != nil {
		return a.reject(kind, err)
	}
	ep, ok := a.endpoints[req.Agent]
	if !ok || req.Agent != kind {
		return a.reject(kind, fmt.Errorf("request for agent kind %q on the queue of %q", req.Agent, kind))
	}
	callCtx, cancel := context.WithDeadline(hctx, deadline)
	defer cancel()
	callStart := a.now()
	res := a.caller.call(callCtx, ep, call{action: req.Name, key: req.IdempotencyKey, attempt: req.Attempt, completeBy: req.CompleteBy, body: body,
		token: req.Token, throttled: func(after time.Duration) { a.noteThrottled(hctx, kind, req, after) }})
	res = hideToken(res, req.Token)
	callTook := a.now().Sub(callStart)
	failpoint.Inject("agent-after-call")

	reply := messages.StepReply{SchemaVersion: messages.SchemaVersion, OrderID: req.OrderID, Step: req.Step, Attempt: req.Attempt,
		StartedAt: &started, CallMicros: max(callTook.Microseconds(), 0)}
	switch res.outcome {
	case callAbandoned:
		a.metrics.requests.WithLabelValues(kind, "abandoned").Inc()
		span.AddEvent("complete_by reached while retrying: gave up")
		log.Info("complete_by reached while retrying; giving up", "last_error", res.reason, "last_answer", res.lastAnswer)
		a.noteAnswer(hctx, req, reply, res.lastAnswer)
		return nil
	case callShutdown:
		a.metrics.requests.WithLabelValues(kind, "requeued").Inc()
		return errors.New("shutting down before the call ended")
	case callOK:
		reply.Outcome, reply.Result = messages.OutcomeOK, a.redact.JSON(res.result)
	case callAccepted:
		// The step waits for the service's callback: the reply holds the
		// attempt open and says what the service answered.
		reply.Outcome, reply.LastAnswer = messages.OutcomeAccepted, a.answerText(res.lastAnswer)
		reply.HoldMS = min(max(res.hold.Milliseconds(), 0), messages.MaxHoldMS)
	case callPermanent:
		reply.Outcome, reply.Error = messages.OutcomeFailed, failureText(a.redact.String(res.reason))
		reply.LastAnswer = a.answerText(res.lastAnswer)
		span.SetStatus(codes.Error, reply.Error)
	}
	span.SetAttributes(attribute.String("sas.outcome", reply.Outcome))
	rctx, rspan := a.tr.Start(callCtx, "publish reply", trace.WithSpanKind(trace.SpanKindProducer))
	err = a.sendReply(rctx, reply)
	if err != nil {
		rspan.SetStatus(codes.Error, err.Error())
	}
	rspan.End()
	if err != nil {
		if callCtx.Err() != nil && errors.Is(callCtx.Err(), context.DeadlineExceeded) {
			a.metrics.abandoned.WithLabelValues("deadline").Inc()
			a.metrics.requests.WithLabelValues(kind, "abandoned").Inc()
			log.Info("complete_by reached before the reply was confirmed; giving up", "err", err)
			return nil
		}
		a.metrics.requests.WithLabelValues(kind, "requeued").Inc()
		return fmt.Errorf("send reply: %w", err)
	}
	a.metrics.requests.WithLabelValues(kind, reply.Outcome).Inc()
	log.Debug("replied", "outcome", reply.Outcome)
	return nil
}

// hideToken takes the step's token out of what a service answered: an
// answer is kept and shown to every console viewer, and the token would
// let its reader end the step. A token holds no character JSON escapes,
// so it is replaced in a result as in a text.
func hideToken(res callResult, token string) callResult {
	if token == "" {
		return res
	}
	const hidden = "[step token]"
	res.reason = strings.ReplaceAll(res.reason, token, hidden)
	res.lastAnswer = strings.ReplaceAll(res.lastAnswer, token, hidden)
	if bytes.Contains(res.result, []byte(token)) {
		res.result = bytes.ReplaceAll(res.result, []byte(token), []byte(hidden))
	}
	return res
}

// answerText is a service's answer as a reply carries it: redacted and
// made to fit (messages.BoundText).
func (a *agent) answerText(answer string) string {
	return strings.TrimSpace(messages.BoundText(a.redact.String(answer), messages.MaxAnswerBytes))
}

// noteAnswer tells the scheduler, before complete_by, the last answer the
// service gave for an attempt the agent gave up on: an abandoned reply,
// which changes nothing but the step's last answer, so that "complete_by
// passed" can be told from "down" and "refusing". Past complete_by it
// sends nothing: the attempt is no longer the agent's to speak for.
func (a *agent) noteAnswer(ctx context.Context, req messages.StepRequest, reply messages.StepReply, answer string) {
	if answer = a.answerText(answer); answer == "" {
		return
	}
	reply.Outcome, reply.LastAnswer = messages.OutcomeAbandoned, answer
	nctx, cancel := context.WithDeadline(context.WithoutCancel(ctx), req.CompleteBy)
	defer cancel()
	if err := a.sendReply(nctx, reply); err != nil {
		a.logger.Info("could not note the last answer before complete_by", "order_id", req.OrderID, "step", req.Step, "err", err)
	}
}

// noteThrottled tells the schedulers, before complete_by, that the
// service answered 429 with a Retry-After of after: a throttled reply,
// which changes nothing of the step and lowers its kind's rate for a
// while across every replica. At most one a second per kind is sent.
func (a *agent) noteThrottled(ctx context.Context, kind string, req messages.StepRequest, after time.Duration) {
	now := a.now()
	a.throttleMu.Lock()
	if last, ok := a.throttleSent[kind]; ok && now.Sub(last) < time.Second {
		a.throttleMu.Unlock()
		return
	}
	a.throttleSent[kind] = now
	a.throttleMu.Unlock()
	reply := messages.StepReply{SchemaVersion: messages.SchemaVersion, OrderID: req.OrderID, Step: req.Step, Attempt: req.Attempt,
		Outcome: messages.OutcomeThrottled, RetryAfterMS: min(max(after.Milliseconds(), 1), messages.MaxHoldMS)}
	nctx, cancel := context.WithDeadline(context.WithoutCancel(ctx), req.CompleteBy)
	defer cancel()
	if err := a.sendReply(nctx, reply); err != nil {
		a.logger.Info("could not tell the schedulers of a 429", "order_id", req.OrderID, "step", req.Step, "err", err)
	}
}

// failureText is a failure's reason as a reply carries it: the words of
// whoever failed, made to fit (messages.BoundText).
func failureText(reason string) string {
	if reason = strings.TrimSpace(messages.BoundText(reason, messages.MaxReasonBytes)); reason == "" {
		return "the service refused the step, without a reason"
	}
	return reason
}

// replyBody encodes reply and reads it back with the decoder every
// scheduler uses: a reply a scheduler of this release would refuse is
// never sent. One it would refuse becomes a failure for good saying
// why (a result is checked before; this is the last word).
func replyBody(reply messages.StepReply) ([]byte, error) {
	body, err := messages.Encode(reply)
	if err == nil {
		_, err = messages.DecodeStepReply(body)
	}
	if err == nil {
		return body, nil
	}
	reply.Outcome, reply.Result = messages.OutcomeFailed, nil
	reply.Error = failureText("the agent could not make a reply a scheduler would take: " + err.Error())
	return messages.Encode(reply)
}

// sendReply publishes reply to the replies queue, trying again after a
// lost connection until ctx (the step's deadline) ends.
func (a *agent) sendReply(ctx context.Context, reply messages.StepReply) error {
	sent := a.now()
	reply.SentAt = &sent
	body, err := replyBody(reply)
	if err != nil {
		return err
	}
	msg := amqp.Publishing{
		ContentType: messages.ContentType,
		Type:        messages.TypeStepReply,
		MessageId:   fmt.Sprintf("%s/%d/%d/reply", reply.OrderID, reply.Step, reply.Attempt),
		Timestamp:   a.now(),
		Headers:     a.tr.InjectAMQP(ctx, nil),
		Body:        body,
	}
	if a.cfg.TransientSteps() {
		// A reply a broker restart loses is sent again: its scheduler
		// puts the step back to pending when its connection comes back.
		msg.DeliveryMode = amqp.Transient
	}
	backoff := 50 * time.Millisecond
	for {
		err = a.pub.Publish(ctx, "", a.topo.Queue(messages.RepliesQueue), msg)
		if err == nil || ctx.Err() != nil {
			return err
		}
		t := time.NewTimer(backoff)
		select {
		case <-ctx.Done():
			t.Stop()
			return err
		case <-t.C:
		}
		backoff = min(backoff*2, time.Second)
	}
}

func (a *agent) reject(kind string, err error) error {
	a.metrics.requests.WithLabelValues(kind, "rejected").Inc()
	return broker.RejectFor(err, messages.ReasonInvalidValue)
}
