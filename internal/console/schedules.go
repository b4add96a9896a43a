package console

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"

	"sas/internal/orderfilter"
	"sas/internal/statestore"
	"sas/internal/workflow"
)

// schedules are the deployment's schedules by name: in a partitioned
// deployment every partition's (each schedule kept by one), each naming
// its partition.
func (s *server) schedules(ctx context.Context) ([]statestore.ScheduleRow, error) {
	if s.stores.Layout == nil {
		return s.store.Schedules(ctx)
	}
	var all []statestore.ScheduleRow
	for _, p := range s.stores.Parts {
		rows, err := p.Store.Schedules(ctx)
		if err != nil {
			return nil, p.Named(err)
		}
		for i := range rows {
			rows[i].Partition = p.Name
		}
		all = append(all, rows...)
	}
	slices.SortStableFunc(all, func(a, b statestore.ScheduleRow) int {
		return cmp.Or(strings.Compare(a.Name, b.Name), strings.Compare(a.Partition, b.Partition))
	})
	return all, nil
}

// scheduleStore is the store keeping schedule row.
func (s *server) scheduleStore(row statestore.ScheduleRow) *statestore.Store {
	for _, p := range s.stores.Parts {
		if row.Partition != "" && p.Name == row.Partition {
			return p.Store
		}
	}
	return s.store
}

func (s *server) schedulesPage(w http.ResponseWriter, r *http.Request, rq *request) {
	rows, err := s.schedules(r.Context())
	if err != nil {
		s.storeError(w, r, rq, err, "schedule")
		return
	}
	s.render(w, r, rq, http.StatusOK, "schedules.html", "Schedules", rows)
}

// scheduleVerb is what an operator may do to a schedule: the question
// its confirmation asks and its button; false for anything else.
func scheduleVerb(verb string) (question, button string, ok bool) {
	switch verb {
	case "pause":
		return "Pause schedule %s? Its ticks start no order until it is resumed.", "Pause", true
	case "resume":
		return "Resume schedule %s? It ticks again from its next tick after now; the ticks missed while it was paused are not caught up.", "Resume", true
	case "trigger":
		return "Start an order of schedule %s now? It is out of its ticks, and starts whatever the schedule's overlap.", "Start it", true
	}
	return "", "", false
}

// scheduleOf reads the schedule the path names, answering 404 for an
// unknown one or verb.
func (s *server) scheduleOf(w http.ResponseWriter, r *http.Request, rq *request) (statestore.ScheduleRow, string, bool) {
	verb := r.PathValue("verb")
	if _, _, ok := scheduleVerb(verb); !ok {
		s.notFound(w, r)
		return statestore.ScheduleRow{}, "", false
	}
	name := r.PathValue("name")
	rows, err := s.schedules(r.Context())
	if err != nil {
		s.storeError(w, r, rq, err, "schedule")
		return statestore.ScheduleRow{}, "", false
	}
	for _, row := range rows {
		if row.Name == name && row.InFile {
			return row, verb, true
		}
	}
	s.fail(w, r, rq, http.StatusNotFound, "There is no schedule "+orderfilter.Clip(name, 64)+".")
	return statestore.ScheduleRow{}, "", false
}

func (s *server) confirmSchedule(w http.ResponseWriter, r *http.Request, rq *request) {
	if !s.mayAct(w, r, rq) {
		return
	}
	row, verb, ok := s.scheduleOf(w, r, rq)
	if !ok {
		return
	}
	question, button, _ := scheduleVerb(verb)
	details := []string{fmt.Sprintf("%s (%s), workflow %s; next tick %s.", row.Cron, row.Timezone, row.Workflow, row.NextTick.UTC().Format("2006-01-02 15:04:05Z"))}
	s.render(w, r, rq, http.StatusOK, "confirm.html", "Schedule "+row.Name, confirmData{
		Question: fmt.Sprintf(question, row.Name), Details: details,
		Action: "/schedules/" + row.Name + "/" + verb, Button: button, Back: "/schedules", Danger: verb == "pause",
	})
}

func (s *server) scheduleAction(w http.ResponseWriter, r *http.Request, rq *request) {
	row, verb, ok := s.scheduleOf(w, r, rq)
	if !ok {
		return
	}
	var err error
	notice := ""
	switch verb {
	case "trigger":
		_, err = s.scheduleStore(row).TriggerSchedule(r.Context(), row.Name, claimedBy(rq))
		notice = "triggered"
	default:
		pause := verb == "pause"
		next := row.NextTick
		if !pause {
			var sc workflow.Schedule
			sc, err = workflow.ParseTicks(row.Cron, row.Timezone)
			if err == nil {
				now, nerr := s.scheduleStore(row).Now(r.Context())
				next, err = sc.Next(now), nerr
			}
		}
		if err == nil {
			err = s.scheduleStore(row).PauseSchedule(r.Context(), row.Name, pause, next, claimedBy(rq))
		}
		notice = map[bool]string{true: "paused", false: "resumed"}[pause]
	}
	if errors.Is(err, statestore.ErrNoSchedule) {
		s.fail(w, r, rq, http.StatusNotFound, "There is no schedule "+orderfilter.Clip(row.Name, 64)+".")
		return
	}
	if err != nil {
		s.storeError(w, r, rq, err, "schedule "+row.Name)
		return
	}
	s.logger.Info("console: schedule "+verb, "user", rq.user.Name, "schedule", row.Name)
	s.redirect(w, r, "/schedules", notice)
}
