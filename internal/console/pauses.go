package console

import (
	"fmt"
	"net/http"
	"strings"
	"unicode/utf8"

	"sas/internal/orderfilter"
	"sas/internal/statestore"
	"sas/internal/workflow"
)

// maxPauseReason bounds a pause's reason, as sasctl and the API do.
const maxPauseReason = 500

// pausesData is the pauses page's: what is paused, and the workflows the
// console's file names (to choose one to pause).
type pausesData struct {
	Pauses    []statestore.Pause
	Workflows []string
}

// pausesPage lists what is paused (workflows and agent kinds, then
// orders) and offers to pause a workflow or an agent kind.
func (s *server) pausesPage(w http.ResponseWriter, r *http.Request, rq *request) {
	rows, err := s.stores.PausesIn(r.Context(), 200, nil)
	if err != nil {
		s.storeError(w, r, rq, err, "pauses")
		return
	}
	var names []string
	if s.workflows != nil {
		names = s.workflows.Names()
	}
	s.render(w, r, rq, http.StatusOK, "pauses.html", "Pauses", pausesData{rows, names})
}

// pauseTarget reads what a pause or resume of a workflow or an agent
// kind names: the path's scope and verb, the query's or form's name.
// Anything else is a 404; a name out of its rules a 400.
func (s *server) pauseTarget(w http.ResponseWriter, r *http.Request, rq *request) (scope, name string, pause, ok bool) {
	scope, verb := r.PathValue("scope"), r.PathValue("verb")
	if (scope != "workflow" && scope != "kind") || (verb != "pause" && verb != "resume") {
		s.notFound(w, r)
		return "", "", false, false
	}
	name = strings.TrimSpace(r.FormValue("name"))
	var err error
	if scope == "workflow" {
		err = workflow.CheckName("workflow", name, 64)
	} else {
		err = workflow.CheckKind(name)
	}
	if err != nil {
		s.fail(w, r, rq, http.StatusBadRequest, err.Error())
		return "", "", false, false
	}
	return scope, name, verb == "pause", true
}

// pauseQuestion is a confirmation's question and what it holds.
func pauseQuestion(scope, name string, pause bool) (question string, details []string) {
	switch {
	case scope == "workflow" && pause:
		return fmt.Sprintf("Pause workflow %s?", name), []string{
			"Nothing new of its running orders is claimed; their steps in flight end normally; their timers, waits and deadlines do not fire while paused.",
			"Orders of it submitted meanwhile are written and wait, paused: no sender is refused.",
		}
	case scope == "workflow":
		return fmt.Sprintf("Resume workflow %s?", name), []string{
			"The orders paused with it run on: pending steps are claimed at once, timers that fell due fire, deadlines have moved on by the time paused. An order paused on its own stays paused.",
		}
	case pause:
		return fmt.Sprintf("Pause agent kind %s?", name), []string{
			"No step of it is claimed, in any order, until it is resumed; its steps in flight end normally.",
		}
	default:
		return fmt.Sprintf("Resume agent kind %s?", name), []string{"Its pending steps are claimed again."}
	}
}

func (s *server) confirmPauseTarget(w http.ResponseWriter, r *http.Request, rq *request) {
	if !s.mayAct(w, r, rq) {
		return
	}
	scope, name, pause, ok := s.pauseTarget(w, r, rq)
	if !ok {
		return
	}
	question, details := pauseQuestion(scope, name, pause)
	d := confirmData{
		Question: question, Details: details, Fields: map[string]string{"name": name},
		Action: r.URL.Path, Button: map[bool]string{true: "Pause", false: "Resume"}[pause], Back: "/pauses", Danger: pause,
	}
	if pause {
		d.Inputs = []confirmInput{{Name: "reason", Label: "Why (for whoever reads the pause)"}}
	}
	s.render(w, r, rq, http.StatusOK, "confirm.html", question, d)
}

func (s *server) pauseTargetAction(w http.ResponseWriter, r *http.Request, rq *request) {
	scope, name, pause, ok := s.pauseTarget(w, r, rq)
	if !ok {
		return
	}
	reason := r.FormValue("reason")
	if !utf8.ValidString(reason) || strings.ContainsRune(reason, 0) || utf8.RuneCountInString(reason) > maxPauseReason {
		s.fail(w, r, rq, http.StatusBadRequest, fmt.Sprintf("The reason must be text of at most %d characters.", maxPauseReason))
		return
	}
	var err error
	done := scope + map[bool]string{true: "-paused", false: "-resumed"}[pause]
	switch {
	case scope == "workflow" && pause:
		_, err = s.stores.PauseWorkflow(r.Context(), name, reason, claimedBy(rq))
	case scope == "workflow":
		_, err = s.stores.ResumeWorkflow(r.Context(), name, claimedBy(rq))
	case pause:
		_, err = s.stores.PauseKind(r.Context(), name, reason, claimedBy(rq))
	default:
		var outcome string
		if outcome, err = s.stores.ResumeKind(r.Context(), name, claimedBy(rq)); err == nil && outcome == statestore.NotPaused {
			s.fail(w, r, rq, http.StatusConflict, "Agent kind "+orderfilter.Clip(name, 64)+" is not paused.")
			return
		}
	}
	if err != nil {
		s.storeError(w, r, rq, err, scope+" "+orderfilter.Clip(name, 64))
		return
	}
	s.logger.Info("console: "+r.PathValue("verb")+" "+scope, "user", rq.user.Name, scope, name)
	s.redirect(w, r, "/pauses", done)
}
