package remote

import (
	"net/http"
	"time"
)

// Traffic is what one action of the service saw: when each call came (at
// most maxArrivals kept, the first ones) and the most calls in progress
// at once, for a test that measures what reaches a service.
type Traffic struct {
	// Arrivals are the calls' arrival times, Unix milliseconds.
	Arrivals []int64 `json:"arrivals_ms"`
	// PeakInFlight is the most calls in progress at once.
	PeakInFlight int `json:"peak_in_flight"`
	inFlight     int
}

// maxArrivals bounds Traffic.Arrivals.
const maxArrivals = 1_000_000

// enter counts a call of action coming in; the function returned counts
// it going out.
func (s *Service) enter(action string) func() {
	s.mu.Lock()
	defer s.mu.Unlock()
	tr := s.traffic[action]
	if tr == nil {
		tr = &Traffic{}
		s.traffic[action] = tr
	}
	tr.inFlight++
	tr.PeakInFlight = max(tr.PeakInFlight, tr.inFlight)
	if len(tr.Arrivals) < maxArrivals {
		tr.Arrivals = append(tr.Arrivals, time.Now().UnixMilli())
	}
	return func() {
		s.mu.Lock()
		tr.inFlight--
		s.mu.Unlock()
	}
}

// getTraffic answers GET /admin/traffic: each action's Traffic.
func (s *Service) getTraffic(w http.ResponseWriter, _ *http.Request) {
	s.mu.Lock()
	out := make(map[string]Traffic, len(s.traffic))
	for action, tr := range s.traffic {
		out[action] = Traffic{Arrivals: append([]int64(nil), tr.Arrivals...), PeakInFlight: tr.PeakInFlight}
	}
	s.mu.Unlock()
	writeJSONValue(w, out)
}

// deleteTraffic answers DELETE /admin/traffic: what was seen so far is
// forgotten (the calls in progress stay counted).
func (s *Service) deleteTraffic(w http.ResponseWriter, _ *http.Request) {
	s.mu.Lock()
	for _, tr := range s.traffic {
		tr.Arrivals, tr.PeakInFlight = nil, tr.inFlight
	}
	s.mu.Unlock()
	w.WriteHeader(http.StatusNoContent)
}
