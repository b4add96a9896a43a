package bench

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"sort"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"sas/internal/messages"
	"sas/internal/statestore/lab"
)

// httpLoad submits through the API service instead of the submit queue
// (--via http): POST /api/v1/orders with a token, confirmWindow requests
// in flight at once; with await, each order is also awaited (GET
// /orders/{id}/await, asked again until it ends) and the moment its end
// came back is kept, to set against the moment the order ended in the
// store: what awaiting over HTTP adds.
type httpLoad struct {
	base, token string
	// namespace, when set, is where the orders go (Sas-Namespace).
	namespace string
	client    *http.Client
	await     bool
	// awaitCtx outlives the load: the window's orders are awaited while
	// they drain.
	awaitCtx context.Context
	awaits   sync.WaitGroup

	mu       sync.Mutex
	returned map[string]time.Time // order id: when its await came back ended
	failed   int
}

func newHTTPLoad(ctx context.Context, base, token string, await bool) *httpLoad {
	return &httpLoad{base: base + "/api/v1", token: token, await: await, awaitCtx: ctx, returned: map[string]time.Time{},
		client: &http.Client{Timeout: 90 * time.Second, Transport: &http.Transport{MaxIdleConns: 2 * confirmWindow,
			MaxIdleConnsPerHost: 2 * confirmWindow, IdleConnTimeout: 30 * time.Second}}}
}

func (h *httpLoad) do(ctx context.Context, method, path string, body []byte) (*http.Response, error) {
	var r io.Reader
	if body != nil {
		r = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, h.base+path, r)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+h.token)
	if h.namespace != "" {
		req.Header.Set("Sas-Namespace", h.namespace)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	return h.client.Do(req)
}

// submit posts one order; nil once the API took it (202, or 200 for the
// same order again).
func (h *httpLoad) submit(ctx context.Context, body []byte) error {
	resp, err := h.do(ctx, http.MethodPost, "/orders", body)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusAccepted && resp.StatusCode != http.StatusOK {
		return fmt.Errorf("submit: %s: %s", resp.Status, b)
	}
	return nil
}

// awaitEnd long-polls the order until it ends and keeps when that came
// back.
func (h *httpLoad) awaitEnd(id string) {
	for h.awaitCtx.Err() == nil {
		resp, err := h.do(h.awaitCtx, http.MethodGet, "/orders/"+id+"/await?timeout=30s", nil)
		if err != nil {
			break
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		at := time.Now()
		if resp.StatusCode != http.StatusOK {
			break
		}
		if resp.Header.Get("Sas-Ended") == "true" {
			h.mu.Lock()
			h.returned[id] = at
			h.mu.Unlock()
			return
		}
	}
	h.mu.Lock()
	h.failed++
	h.mu.Unlock()
}

// runHTTP is generator.run over HTTP.
func (g *generator) runHTTP(ctx context.Context, next func(ctx context.Context, started int64) bool) error {
	slots := make(chan struct{}, confirmWindow)
	var wg sync.WaitGroup
	defer wg.Wait()
	var started int64
	for next(ctx, started) {
		o := g.sampler.next()
		body, err := messages.Encode(o)
		if err != nil {
			return err
		}
		select {
		case slots <- struct{}{}:
		case <-ctx.Done():
			return nil
		}
		started++
		wg.Go(func() {
			defer func() { <-slots }()
			if err := g.http.submit(context.WithoutCancel(ctx), body); err != nil {
				g.failed.Add(1)
				return
			}
			g.published.Add(1)
			if g.http.await {
				g.http.awaits.Go(func() { g.http.awaitEnd(o.OrderID) })
			}
		})
	}
	return nil
}

// overhead waits for the awaits (within the context given at the start)
// and sets, for each order that came in [from, to] on the database clock,
// when its await came back against when it ended in the store.
func (h *httpLoad) overhead(ctx context.Context, pool *pgxpool.Pool, from, to time.Time) (latencyMS, int, error) {
	h.awaits.Wait()
	h.mu.Lock()
	ids := make([]string, 0, len(h.returned))
	for id := range h.returned {
		ids = append(ids, id)
	}
	failed := h.failed
	h.mu.Unlock()
	// The orders placed in the window, as the report's placed counts
	// them (placed_at, the publisher's clock): on a loaded machine an
	// order placed at the window's end is written after it.
	rows, err := pool.Query(ctx, `SELECT order_id::text, updated_at FROM orders
		WHERE order_id = ANY($1::uuid[]) AND status IN ('completed', 'failed') AND placed_at >= $2 AND placed_at < $3`, ids, from, to)
	if err != nil {
		return latencyMS{}, failed, err
	}
	defer rows.Close()
	var d []time.Duration
	for rows.Next() {
		var id string
		var ended time.Time
		if err := rows.Scan(&id, &ended); err != nil {
			return latencyMS{}, failed, err
		}
		h.mu.Lock()
		d = append(d, h.returned[id].Sub(ended))
		h.mu.Unlock()
	}
	if err := rows.Err(); err != nil {
		return latencyMS{}, failed, err
	}
	return toMS(summarize(d)), failed, nil
}

// summarize is the distribution of d.
func summarize(d []time.Duration) lab.Latency {
	if len(d) == 0 {
		return lab.Latency{}
	}
	sort.Slice(d, func(i, j int) bool { return d[i] < d[j] })
	at := func(q float64) time.Duration { return d[min(len(d)-1, int(q*float64(len(d))))] }
	var sum time.Duration
	for _, x := range d {
		sum += x
	}
	return lab.Latency{N: len(d), P50: at(0.50), P95: at(0.95), P99: at(0.99), Max: d[len(d)-1], Mean: sum / time.Duration(len(d))}
}
