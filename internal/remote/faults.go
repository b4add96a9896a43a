package remote

import (
	"encoding/json"
	"fmt"
)

// Faults is what the service does wrong on purpose, for one action.
// Rates are probabilities per request, from 0 to 1.
type Faults struct {
	// Latency is uniform between LatencyMinMS and LatencyMaxMS.
	LatencyMinMS int `json:"latency_min_ms,omitempty"`
	LatencyMaxMS int `json:"latency_max_ms,omitempty"`
	// ErrorRate answers 503 without doing anything.
	ErrorRate float64 `json:"error_rate,omitempty"`
	// RateLimitRate answers 429 with Retry-After: RetryAfterS (default 1).
	RateLimitRate float64 `json:"rate_limit_rate,omitempty"`
	RetryAfterS   int     `json:"retry_after_s,omitempty"`
	// HangRate holds the request for HangMS (0: until the caller gives
	// up, at most a minute), then answers 503 without doing anything.
	HangRate float64 `json:"hang_rate,omitempty"`
	HangMS   int     `json:"hang_ms,omitempty"`
	// ApplyThenFailRate records the effect, then answers 500: the caller
	// sees an error for work that was done.
	ApplyThenFailRate float64 `json:"apply_then_fail_rate,omitempty"`
	// FailOrders are refused for good (400) by this action.
	FailOrders []string `json:"fail_orders,omitempty"`
	// FailKeys are refused for good (400) by this action, by idempotency
	// key: one instance of a for_each step, not its whole order.
	FailKeys []string `json:"fail_keys,omitempty"`
	// RefuseIf names a payload field: an order whose payload has it
	// true is refused for good (400), as a service refuses what it
	// cannot take; a re-run with it corrected goes through.
	RefuseIf string `json:"refuse_if,omitempty"`
}

// FaultConfig maps an action name, or "*" for every action, to its faults.
// An action's own entry replaces "*" for that action.
type FaultConfig map[string]Faults

// ParseFaultConfig reads a FaultConfig from JSON and checks it.
func ParseFaultConfig(raw []byte) (FaultConfig, error) {
	cfg := FaultConfig{}
	if len(raw) == 0 {
		return cfg, nil
	}
	if err := json.Unmarshal(raw, &cfg); err != nil {
		return nil, fmt.Errorf("fault config: %w", err)
	}
	for name, f := range cfg {
		if name != "*" && !validAction(name) {
			return nil, fmt.Errorf("fault config: %q is not an action name (letters, digits, _ . -) or \"*\"", name)
		}
		for _, r := range []float64{f.ErrorRate, f.RateLimitRate, f.HangRate, f.ApplyThenFailRate} {
			if r < 0 || r > 1 {
				return nil, fmt.Errorf("fault config %q: rates must be between 0 and 1", name)
			}
		}
		if f.LatencyMinMS < 0 || f.LatencyMaxMS < 0 || f.HangMS < 0 || f.RetryAfterS < 0 {
			return nil, fmt.Errorf("fault config %q: durations must not be negative", name)
		}
		if f.LatencyMaxMS < f.LatencyMinMS {
			f.LatencyMaxMS = f.LatencyMinMS
			cfg[name] = f
		}
	}
	return cfg, nil
}

// For returns the faults of one action.
func (c FaultConfig) For(action string) Faults {
	if f, ok := c[action]; ok {
		return f
	}
	return c["*"]
}
