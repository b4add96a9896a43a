package console

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"slices"
	"strings"
	"testing"

	"golang.org/x/crypto/bcrypt"

	"sas/internal/intake"
	"sas/internal/statestore"
)

func TestUsersActInTheirNamespaces(t *testing.T) {
	t.Parallel()
	hash, err := HashPassword("pw", bcrypt.MinCost)
	if err != nil {
		t.Fatal(err)
	}
	if got := UserLine("ann", Operator, hash, []string{"default"}); got != "ann:operator:"+hash {
		t.Fatalf("a user of the default namespace: %q", got)
	}
	data, _ := AddUser(nil, "ann", Operator, hash, []string{"team-a", "team-b"})
	data, _ = AddUser(data, "bob", Viewer, hash, nil)
	data, _ = AddUser(data, "root", Viewer, hash, []string{"*"})
	if !strings.Contains(string(data), "ann:operator:"+hash+":team-a,team-b\n") {
		t.Fatalf("the file:\n%s", data)
	}
	users, err := ParseUsers("users", data)
	if err != nil {
		t.Fatal(err)
	}
	names := []string{"default", "team-a", "team-b"}
	for _, c := range []struct {
		user      string
		views     []string
		everyRole string
	}{
		{"ann", []string{"team-a", "team-b"}, ""},
		{"bob", []string{"default"}, ""},
		{"root", []string{"*", "default", "team-a", "team-b"}, Viewer},
	} {
		views, every := users[c.user].views(names)
		if !slices.Equal(views, c.views) || every != c.everyRole {
			t.Errorf("%s: views %v (every namespace as %q), want %v (%q)", c.user, views, every, c.views, c.everyRole)
		}
	}
	// In a deployment of the default namespace alone, its user looks at
	// every namespace.
	if views, every := users["bob"].views([]string{"default"}); !slices.Equal(views, []string{"*", "default"}) || every != Viewer {
		t.Errorf("the default namespace's user of a one-namespace deployment: %v %q", views, every)
	}
	// Roles that differ: every namespace's view takes the lowest.
	mixed := User{Grants: map[string]string{"team-a": Operator, "*": Viewer}}
	if views, every := mixed.views(names); !slices.Equal(views, []string{"*", "default", "team-a", "team-b"}) || every != Viewer ||
		mixed.roleIn("team-a") != Operator || mixed.roleIn("team-b") != Viewer {
		t.Errorf("mixed roles: %v %q", views, every)
	}
	if views, _ := (User{Grants: map[string]string{"team-z": Operator}}).views(names); len(views) != 0 {
		t.Errorf("a user of a namespace that does not exist looks at %v", views)
	}
}

// TestAFailedReadOfTheNamespacesShowsNoMore: a user of the default
// namespace looks at every namespace while it is the only one; when the
// namespaces cannot be read, it looks at the namespace it was granted by
// name only, and a user of every namespace still at every one.
func TestAFailedReadOfTheNamespacesShowsNoMore(t *testing.T) {
	t.Parallel()
	down := false
	read := func(context.Context) ([]statestore.Namespace, error) {
		if down {
			return nil, errors.New("the store did not answer")
		}
		return []statestore.Namespace{{Name: "default"}}, nil
	}
	s := &server{known: intake.NewNamespaces(read), logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
	ann := func() *request {
		return &request{user: User{Name: "ann", Grants: map[string]string{"default": Operator}}, session: &session{}}
	}
	if rq := ann(); !s.scope(t.Context(), rq) || !slices.Equal(rq.views, []string{"*", "default"}) || rq.ns != "*" {
		t.Fatalf("the one namespace's user: views %v, looking at %q", rq.views, rq.ns)
	}
	down = true
	s.known = intake.NewNamespaces(read) // nothing kept
	if rq := ann(); !s.scope(t.Context(), rq) || !slices.Equal(rq.views, []string{"default"}) || rq.ns != "default" || rq.user.Role != Operator {
		t.Fatalf("without the namespaces: views %v, looking at %q as %q", rq.views, rq.ns, rq.user.Role)
	}
	root := &request{user: User{Name: "root", Grants: map[string]string{"*": Viewer}}, session: &session{}}
	if !s.scope(t.Context(), root) || !slices.Equal(root.views, []string{"*"}) || root.user.Role != Viewer {
		t.Fatalf("a user of every namespace without the namespaces: views %v as %q", root.views, root.user.Role)
	}
}
