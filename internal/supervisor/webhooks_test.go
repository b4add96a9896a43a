package supervisor

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"sas/internal/statestore"
)

type fakeWebhookStore struct {
	due   []statestore.WebhookDelivery
	tries []statestore.WebhookTry
}

func (f *fakeWebhookStore) ClaimWebhooks(context.Context, int, time.Duration) ([]statestore.WebhookDelivery, error) {
	d := f.due
	f.due = nil
	return d, nil
}

func (f *fakeWebhookStore) WebhookTried(_ context.Context, t statestore.WebhookTry) (string, error) {
	f.tries = append(f.tries, t)
	if t.OK {
		return statestore.WebhookSent, nil
	}
	return statestore.WebhookPending, nil
}

// TestWebhooksAreSignedAndNeverFollowARedirect: a delivery is posted
// with its id and a signature the receiver can check with the secret
// (HMAC-SHA256 of "UNIX.BODY"); a 2xx is taken, a 500 is tried again, a
// redirect is an answer (its target gets nothing), and a secret missing
// from the environment sends nothing and says which variable.
func TestWebhooksAreSignedAndNeverFollowARedirect(t *testing.T) {
	t.Parallel()
	const secret = "whsec-test-0123456789"
	var redirected atomic.Int32
	target := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { redirected.Add(1) }))
	defer target.Close()
	var got []string
	recv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		sig := r.Header.Get(HeaderSignature)
		ts, v1, _ := strings.Cut(strings.TrimPrefix(sig, "t="), ",v1=")
		h := hmac.New(sha256.New, []byte(secret))
		h.Write([]byte(ts + "." + string(body)))
		if !hmac.Equal([]byte(v1), []byte(hex.EncodeToString(h.Sum(nil)))) {
			http.Error(w, "bad signature", http.StatusUnauthorized)
			return
		}
		var env envelope
		if err := json.Unmarshal(body, &env); err != nil {
			t.Errorf("the body: %v", err)
		}
		got = append(got, r.URL.Path+" "+r.Header.Get(HeaderWebhookID)+" "+env.Type)
		switch r.URL.Path {
		case "/down":
			http.Error(w, "down", http.StatusInternalServerError)
		case "/moved":
			http.Redirect(w, r, target.URL, http.StatusTemporaryRedirect)
		}
	}))
	defer recv.Close()
	st := &fakeWebhookStore{due: []statestore.WebhookDelivery{
		{ID: 1, OrderID: "o1", URL: recv.URL + "/ok", SecretEnv: "HOOK", Event: "completed", Body: json.RawMessage(`{"status":"completed"}`)},
		{ID: 2, OrderID: "o2", URL: recv.URL + "/down", SecretEnv: "HOOK", Event: "failed", Body: json.RawMessage(`{}`)},
		{ID: 3, OrderID: "o3", URL: recv.URL + "/moved", SecretEnv: "HOOK", Event: "completed", Body: json.RawMessage(`{}`)},
		{ID: 4, OrderID: "o4", URL: recv.URL + "/ok", SecretEnv: "MISSING", Event: "completed", Body: json.RawMessage(`{}`)},
	}}
	w := &webhookSender{store: st, client: newWebhookClient(5 * time.Second), cfg: Config{WebhookTimeout: 5 * time.Second, WebhookAttempts: 3},
		env: func(name string) (string, bool) {
			if name == "HOOK" {
				return secret, true
			}
			return "", false
		},
		now: time.Now, logger: slog.New(slog.NewTextHandler(io.Discard, nil)), sent: func(string) {}}
	n, err := w.round(context.Background())
	if err != nil || n != 4 || len(st.tries) != 4 {
		t.Fatalf("round: %d %v, tries %+v", n, err, st.tries)
	}
	ok := []bool{st.tries[0].OK, st.tries[1].OK, st.tries[2].OK, st.tries[3].OK}
	if !ok[0] || ok[1] || ok[2] || ok[3] {
		t.Fatalf("taken %v, want only the first", ok)
	}
	if !strings.Contains(st.tries[1].Why, "500") || !strings.Contains(st.tries[2].Why, "redirect is not followed") ||
		!strings.Contains(st.tries[3].Why, "no MISSING") {
		t.Fatalf("why: %q, %q, %q", st.tries[1].Why, st.tries[2].Why, st.tries[3].Why)
	}
	if redirected.Load() != 0 {
		t.Fatal("a redirect was followed")
	}
	if strings.Join(got, ";") != "/ok 1 order.completed;/down 2 order.failed;/moved 3 order.completed" {
		t.Fatalf("the receiver got %v", got)
	}
	for _, tr := range st.tries {
		if strings.Contains(tr.Why, secret) {
			t.Fatalf("a reason holds the secret: %q", tr.Why)
		}
	}
}
