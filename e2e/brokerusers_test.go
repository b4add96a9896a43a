package e2e

import (
	"errors"
	"fmt"
	neturl "net/url"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"sas/internal/broker"
	"sas/internal/harness/badinput"
	"sas/internal/harness/testenv"
	"sas/internal/messages"
	"sas/internal/submitter"
)

// TestServicesRunAsLeastPrivilegeBrokerUsers creates one RabbitMQ user per
// service with `sasctl broker users`, runs the whole pipeline with each
// service connected as its own user (bad input dead-lettered, a held order
// alerting, orders completing), and checks a user is refused what is
// another's.
func TestServicesRunAsLeastPrivilegeBrokerUsers(t *testing.T) {
	t.Parallel()
	rabbitmqctl := tool(t, "rabbitmqctl")
	s := newStack(t)
	// Classic queues, as a single-node deployment (docker-compose) runs
	// them: a consumer binds its own queue for counted redeliveries.
	s.env = append(s.env, "SAS_QUEUE_TYPE=classic")
	userPrefix := "t-" + testenv.RandomSuffix(8) + "-"
	services := []string{"submitter", "scheduler", "agent", "sasctl", "app", "api"}
	env := append([]string{}, s.env...)
	// Passwords with the characters that break URLs written by hand: the
	// services take them apart from the URL (SAS_AMQP_PASSWORD).
	password := func(svc string) string { return `pw/#@:%? "` + svc }
	for _, svc := range services {
		env = append(env, "SAS_AMQP_PASSWORD_"+strings.ToUpper(svc)+"="+password(svc))
	}
	script := sasctlOK(t, s.env, "broker", "users", "--user-prefix", userPrefix)
	t.Cleanup(func() {
		for _, svc := range services {
			_ = exec.Command(rabbitmqctl, "delete_user", userPrefix+svc).Run()
		}
	})
	cmd := exec.Command("bash", "-e", "-c", script)
	cmd.Env = env
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("running the printed commands: %v\n%s", err, out)
	}
	url := func(svc string) string {
		return fmt.Sprintf("amqp://%s%s@127.0.0.1:5672/", userPrefix, svc)
	}
	settings := func(svc string) []string {
		return []string{"SAS_AMQP_URL=" + url(svc), "SAS_AMQP_PASSWORD=" + password(svc)}
	}
	if !strings.Contains(testenv.AMQPURL(), "127.0.0.1:5672") {
		t.Skip("SAS_TEST_AMQP_URL is not the local broker")
	}
	s.env = append(s.env, settings("sasctl")...)
	p := newPipeline(t, pipelineOpts{on: &s, supervisors: 1,
		faults:       `{"charge_payment":{"error_rate":0.1}}`,
		submitterEnv: settings("submitter"),
		schedulerEnv: settings("scheduler"),
		agentEnv:     settings("agent")})

	// Orders through: sasctl publishes, every service does its part.
	ids := p.submitOrders(t, 30)
	// A held order: the scheduler publishes its alert; sasctl reads it.
	held := messages.NewID()
	p.setFaults(t, `{"charge_payment":{"fail_orders":["`+held+`"]}}`)
	ch := amqpChannel(t)
	body := strings.Replace(badinput.ValidSubmitJSON(held), `"amount":1999`, `"amount":1999,"workflow":"order_hold"`, 1)
	publish(t, ch, p.submit, messages.ContentType, held, []byte(body))
	// Bad input: the submitter dead-letters it.
	publish(t, ch, p.submit, messages.ContentType, "bad-1", []byte("not json"))

	p.waitTerminal(t, append(ids, held), 2*time.Minute)
	p.checkSaga(t, ids)
	// The queues the services declared are classic ones.
	if out, err := exec.Command(rabbitmqctl, "list_queues", "-q", "--no-table-headers", "name", "type").Output(); err != nil {
		t.Fatalf("rabbitmqctl list_queues: %v", err)
	} else if !regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(p.submit) + `\s+classic$`).Match(out) {
		t.Fatalf("queue %s is not classic:\n%s", p.submit, out)
	}
	if al := openAlerts(t, p.env, held); len(al) != 1 {
		t.Fatalf("open alerts of the held order: %+v", al)
	}
	// The API as its own user: it follows status events (an await) and
	// publishes a signal that ends an order's wait.
	api := startAPI(t, p.stack, "", settings("api")...)
	token := apiToken(t, p.stack, "broker-users", "operator")
	approval := messages.NewID()
	if code, _, b := api.call(t, apiCall{method: "POST", path: "/api/v1/orders", token: token,
		body: submitBody(approval, "order_approval", `{"customer":"c","items":[{"sku":"a","qty":1}],"amount":1,"currency":"EUR"}`)}); code != 202 {
		t.Fatalf("submit through the API: %d %s", code, b)
	}
	testenv.Eventually(t, time.Minute, "the order to wait for its approval", func() bool {
		return p.count(t, `SELECT count(*) FROM steps WHERE order_id = $1 AND process_state = 'awaiting'`, approval) == 1
	})
	if code, _, b := api.call(t, apiCall{method: "POST", path: "/api/v1/orders/" + approval + "/signals/approved", token: token, body: `{"by":"ann"}`}); code != 202 {
		t.Fatalf("signal through the API: %d %s", code, b)
	}
	if code, h, b := api.call(t, apiCall{method: "GET", path: "/api/v1/orders/" + approval + "/await?timeout=60s", token: token}); code != 200 ||
		h.Get("Sas-Ended") != "true" || !strings.Contains(string(b), `"status":"completed"`) {
		t.Fatalf("await through the API: %d %s", code, b)
	}
	// The operator's broker user reads the dead letters, and leaves them.
	testenv.Eventually(t, 30*time.Second, "the bad submit dead-lettered", func() bool {
		q, err := ch.QueueDeclarePassive(p.dlq, true, false, false, false, nil)
		return err == nil && q.Messages == 1
	})
	if out, errOut, code := sasctl(t, p.env, "dlq", "list", "submit"); code != 0 || !strings.Contains(out, "bad-1") || !strings.Contains(out, messages.ReasonNotJSON) {
		t.Fatalf("dlq list as the sasctl user: exit %d: %s %s", code, out, errOut)
	}
	if dead := drain(t, ch, p.dlq, 1, 30*time.Second); dead[0].Headers[broker.HeaderErrorReason] != messages.ReasonNotJSON {
		t.Fatalf("dead letter %v", dead[0].Headers)
	}

	// What is another's is refused.
	refused := func(svc string, do func(*amqp.Channel) error) {
		t.Helper()
		expectRefused(t, fmt.Sprintf("amqp://%s@127.0.0.1:5672/", neturl.UserPassword(userPrefix+svc, password(svc))), svc, do)
	}
	refused("agent", func(ch *amqp.Channel) error { // agents do not read orders
		_, err := ch.Consume(p.submit, "", false, false, false, false, nil)
		return err
	})
	refused("submitter", func(ch *amqp.Channel) error { // the submitter does not send step requests
		if err := ch.Confirm(false); err != nil {
			return err
		}
		_ = ch.Publish("", p.topo.Queue(messages.RequestsQueue("payment")), false, false, amqp.Publishing{Body: []byte("x")})
		_, err := ch.QueueDeclarePassive(p.topo.Queue(submitter.Input), true, false, false, false, nil)
		return err
	})
	refused("api", func(ch *amqp.Channel) error { // the API does not read orders
		_, err := ch.Consume(p.submit, "", false, false, false, false, nil)
		return err
	})
	refused("sasctl", func(ch *amqp.Channel) error { // the operator tool does not consume replies
		_, err := ch.Consume(p.topo.Queue(messages.RepliesQueue), "", false, false, false, false, nil)
		return err
	})
}

// expectRefused dials url, runs do on a new channel and requires the
// broker to refuse it (ACCESS_REFUSED), naming who in the failure.
func expectRefused(t *testing.T, url, who string, do func(*amqp.Channel) error) {
	t.Helper()
	conn, err := amqp.Dial(url)
	if err != nil {
		t.Fatalf("dial as %s: %v", who, err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	// The broker refuses by closing the channel; a call made after the
	// refusal was sent, and before the library saw it, fails with
	// "channel/connection is not open" instead. The close says why.
	closed := ch.NotifyClose(make(chan *amqp.Error, 1))
	err = do(ch)
	var ae *amqp.Error
	if !errors.As(err, &ae) || ae.Code != amqp.AccessRefused {
		select {
		case reason := <-closed:
			if reason != nil {
				err, ae = reason, reason
			}
		case <-time.After(10 * time.Second):
		}
	}
	if ae == nil || ae.Code != amqp.AccessRefused {
		t.Errorf("%s was not refused: %v", who, err)
	}
}
