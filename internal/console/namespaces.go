package console

import (
	"context"
	"encoding/json"
	"net/http"
	"slices"

	"sas/internal/orderfilter"
	"sas/internal/statestore"
)

// Namespaces in the console: a user looks at one namespace at a time, or
// at every one when it may act in each (the view of the whole
// deployment). Its role is the one it holds in the namespace it looks at
// (for every one, the lowest it holds in any). In a namespace's view the
// orders list, the order pages and their actions and the bulk jobs are
// that namespace's alone; an order of another is "not found", as one that
// does not exist. Alerts are their order's namespace's, and dead letters
// the namespace sas found them to be of (x-sas-namespace; the others are
// the deployment's). The overview, workflows, schedules and limits are
// the deployment's: they are shown in the view of every namespace only.

// everyNamespace is the view of every namespace.
const everyNamespace = statestore.AllNamespaces

// namespaceNames are the deployment's namespaces, sorted: read again
// when the list kept is older than intake.NamespacesFor, or does not hold
// one of want (a namespace just added is known at once).
func (s *server) namespaceNames(ctx context.Context, want map[string]string) ([]string, error) {
	names, err := s.known.Names(ctx, false)
	if err != nil {
		return nil, err
	}
	for ns := range want {
		if ns != statestore.AllNamespaces && !slices.Contains(names, ns) {
			if names, err = s.known.Names(ctx, true); err != nil {
				return nil, err
			}
			break
		}
	}
	names = slices.Clone(names)
	slices.Sort(names)
	return names, nil
}

// roleIn is u's role in namespace ns ("" for none).
func (u User) roleIn(ns string) string {
	if r, ok := u.Grants[ns]; ok {
		return r
	}
	return u.Grants[statestore.AllNamespaces]
}

// lower is the lesser of two roles ("" is none, the least).
func lower(a, b string) string {
	if a == "" || b == "" {
		return ""
	}
	if a == Viewer || b == Viewer {
		return Viewer
	}
	return Operator
}

// views are the views u may choose among: every namespace first, when u
// has a role in each of names, then each namespace it has a role in. The
// role of every namespace's view is the lowest u holds.
func (u User) views(names []string) (views []string, everyRole string) {
	everyRole = u.Grants[statestore.AllNamespaces]
	if everyRole == "" && len(names) > 0 {
		everyRole = Operator
	}
	for _, ns := range names {
		everyRole = lower(everyRole, u.roleIn(ns))
	}
	if everyRole != "" {
		views = append(views, everyNamespace)
	}
	for _, ns := range names {
		if u.roleIn(ns) != "" {
			views = append(views, ns)
		}
	}
	return views, everyRole
}

// scope sets the request's view (the session's choice when it may still
// make it, else its first) and its role in that view. Without the
// deployment's namespaces (the store did not answer), u's views are the
// namespaces it was granted by name, and every namespace only when it was
// granted every one: it never sees more for a failed read.
func (s *server) scope(ctx context.Context, rq *request) bool {
	names, err := s.namespaceNames(ctx, rq.user.Grants)
	if err != nil {
		s.logger.Error("console: read the namespaces", "err", err)
		for ns := range rq.user.Grants {
			if ns != statestore.AllNamespaces {
				names = append(names, ns)
			}
		}
		slices.Sort(names)
	}
	views, everyRole := rq.user.views(names)
	if err != nil && rq.user.Grants[statestore.AllNamespaces] == "" {
		views = slices.DeleteFunc(views, func(v string) bool { return v == everyNamespace })
	}
	if len(views) == 0 {
		return false
	}
	rq.views = views
	rq.ns = views[0]
	if chosen := rq.session.view(); slices.Contains(views, chosen) {
		rq.ns = chosen
	}
	if rq.ns == everyNamespace {
		rq.user.Role = everyRole
	} else {
		rq.user.Role = rq.user.roleIn(rq.ns)
	}
	return rq.user.Role != ""
}

// everywhere reports whether the request looks at every namespace.
func (rq *request) everywhere() bool { return rq.ns == everyNamespace }

// namespaces are the namespaces the request looks at, nil for every one.
func (rq *request) namespaces() []string {
	if rq.everywhere() {
		return nil
	}
	return []string{rq.ns}
}

// deployment lets a page of the whole deployment through in the view of
// every namespace only.
func (s *server) deployment(h handler) handler {
	return func(w http.ResponseWriter, r *http.Request, rq *request) {
		if !rq.everywhere() {
			s.fail(w, r, rq, http.StatusForbidden, "This page is the whole deployment's: it is shown in the view of every namespace, "+
				"to users of every namespace. You are looking at namespace "+rq.ns+".")
			return
		}
		h(w, r, rq)
	}
}

// inView lets a route of an order through when the order is in the
// request's view; one of another namespace is not found, as one that
// does not exist.
func (s *server) inView(h handler) handler {
	return func(w http.ResponseWriter, r *http.Request, rq *request) {
		if !rq.everywhere() {
			id := r.PathValue("id")
			if !validID(id) {
				h(w, r, rq) // which says an order id is a UUID
				return
			}
			own, found, err := s.stores.Of(r.Context(), id).OwnerOf(r.Context(), id) // its partition's
			if err != nil {
				s.storeError(w, r, rq, err, "order")
				return
			}
			if !found || own.Namespace != rq.ns {
				s.fail(w, r, rq, http.StatusNotFound, "There is no order "+orderfilter.Clip(id, 40)+".")
				return
			}
		}
		h(w, r, rq)
	}
}

// jobInView reports whether a bulk job was made in the request's view:
// every job in the view of every namespace, else those made in its
// namespace alone.
func jobInView(rq *request, job statestore.BulkJob) bool {
	if rq.everywhere() {
		return true
	}
	var f orderfilter.Filter
	return json.Unmarshal(job.Filter, &f) == nil && slices.Equal(f.Namespaces, rq.namespaces())
}

// switchNamespace is the namespace switcher: the session looks at the
// namespace chosen, if the user may look at it, from its next page on.
func (s *server) switchNamespace(w http.ResponseWriter, r *http.Request, rq *request) {
	ns := r.PostForm.Get("ns")
	if !slices.Contains(rq.views, ns) {
		s.fail(w, r, rq, http.StatusForbidden, "You may not look at namespace "+orderfilter.Clip(ns, 63)+".")
		return
	}
	rq.session.setView(ns)
	s.logger.Info("console: namespace chosen", "user", rq.user.Name, "namespace", ns)
	to := "/orders"
	if ns == everyNamespace {
		to = "/"
	}
	http.Redirect(w, r, to, http.StatusSeeOther)
}
