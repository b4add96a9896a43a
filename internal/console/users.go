package console

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"sync"
	"time"

	"golang.org/x/crypto/bcrypt"

	"sas/internal/statestore"
)

// Roles a console user may have.
const (
	// Viewer sees everything and changes nothing.
	Viewer = "viewer"
	// Operator also resubmits, cancels, acknowledges alerts and requeues
	// or discards dead letters.
	Operator = "operator"
)

// DefaultCost is the bcrypt cost of a password hash sasctl makes.
const DefaultCost = 12

// User is one console user: a name, a role and a bcrypt hash of the
// password.
type User struct {
	Name string
	// Role is the user's role in the namespace it is looking at (for a
	// request), or its highest.
	Role string
	// Grants are its role in each namespace it may look at (AllNamespaces:
	// every one). A users file's user has its role in the namespaces its
	// line lists (none: the default one).
	Grants map[string]string
	// Display is how a user signed in at the identity provider is shown
	// (their email); Name is then the provider and the subject.
	Display string
	hash    []byte
}

// shown is the name a page shows.
func (u User) shown() string {
	if u.Display != "" {
		return u.Display
	}
	return u.Name
}

var userNameRE = regexp.MustCompile(`^[A-Za-z0-9._@-]{1,64}$`)

// CheckUserName reports why name cannot be a console user's name.
func CheckUserName(name string) error {
	if !userNameRE.MatchString(name) {
		return fmt.Errorf("user name %q: use 1 to 64 letters, digits, '.', '_', '@' or '-'", name)
	}
	return nil
}

// CheckRole reports why role is not a console role.
func CheckRole(role string) error {
	if role != Viewer && role != Operator {
		return fmt.Errorf("role %q: want %s or %s", role, Viewer, Operator)
	}
	return nil
}

// HashPassword returns the bcrypt hash of password at cost.
func HashPassword(password string, cost int) (string, error) {
	if password == "" {
		return "", errors.New("an empty password")
	}
	if len(password) > 72 {
		return "", errors.New("a password longer than 72 bytes (bcrypt reads no further)")
	}
	h, err := bcrypt.GenerateFromPassword([]byte(password), cost)
	if err != nil {
		return "", err
	}
	return string(h), nil
}

// UserLine is the users-file line of a user: NAME:ROLE:HASH, and
// :NAMESPACE,NAMESPACE when it acts in other namespaces than the default
// one ('*': every one).
func UserLine(name, role, hash string, namespaces []string) string {
	line := name + ":" + role + ":" + hash
	if len(namespaces) > 0 && !slices.Equal(namespaces, []string{statestore.DefaultNamespace}) {
		line += ":" + strings.Join(namespaces, ",")
	}
	return line
}

// CheckNamespaces reports why namespaces cannot be a user's: each a
// namespace's name or '*'.
func CheckNamespaces(namespaces []string) error {
	for _, ns := range namespaces {
		if ns == statestore.AllNamespaces {
			continue
		}
		if err := statestore.CheckNamespace(ns); err != nil {
			return err
		}
	}
	return nil
}

// ParseUsers reads users, one per line (or per ';' in an environment
// variable) as NAME:ROLE:BCRYPT-HASH[:NAMESPACES]; blank lines and lines
// starting with '#' are skipped. src names the source in errors.
func ParseUsers(src string, data []byte) (map[string]User, error) {
	users := map[string]User{}
	var problems []string
	lines := strings.FieldsFunc(string(data), func(r rune) bool { return r == '\n' || r == ';' })
	for i, line := range lines {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		parts := strings.SplitN(line, ":", 4)
		if len(parts) < 3 {
			problems = append(problems, fmt.Sprintf("%s: entry %d: want NAME:ROLE:HASH[:NAMESPACES] (sasctl console user add makes one)", src, i+1))
			continue
		}
		namespaces := []string{statestore.DefaultNamespace}
		if len(parts) == 4 {
			namespaces = strings.Split(parts[3], ",")
			if err := CheckNamespaces(namespaces); err != nil {
				problems = append(problems, fmt.Sprintf("%s: entry %d (%s): %v", src, i+1, parts[0], err))
				continue
			}
		}
		name, role, hash := parts[0], parts[1], parts[2]
		if err := CheckUserName(name); err != nil {
			problems = append(problems, fmt.Sprintf("%s: entry %d: %v", src, i+1, err))
			continue
		}
		if err := CheckRole(role); err != nil {
			problems = append(problems, fmt.Sprintf("%s: entry %d (%s): %v", src, i+1, name, err))
			continue
		}
		if _, err := bcrypt.Cost([]byte(hash)); err != nil {
			problems = append(problems, fmt.Sprintf("%s: entry %d (%s): the password is not a bcrypt hash: %v", src, i+1, name, err))
			continue
		}
		if _, dup := users[name]; dup {
			problems = append(problems, fmt.Sprintf("%s: entry %d: user %s is listed twice", src, i+1, name))
			continue
		}
		grants := map[string]string{}
		for _, ns := range namespaces {
			grants[ns] = role
		}
		users[name] = User{Name: name, Role: role, Grants: grants, hash: []byte(hash)}
	}
	if len(problems) > 0 {
		return nil, errors.New(strings.Join(problems, "\n"))
	}
	return users, nil
}

// AddUser returns the users file data with the user's line set: replaced
// if the user is there, appended if not.
func AddUser(data []byte, name, role, hash string, namespaces []string) ([]byte, bool) {
	line := UserLine(name, role, hash, namespaces)
	var out bytes.Buffer
	replaced := false
	for _, l := range strings.SplitAfter(string(data), "\n") {
		if l == "" {
			continue
		}
		if strings.HasPrefix(strings.TrimSpace(l), name+":") {
			out.WriteString(line + "\n")
			replaced = true
			continue
		}
		out.WriteString(l)
		if !strings.HasSuffix(l, "\n") {
			out.WriteString("\n")
		}
	}
	if !replaced {
		out.WriteString(line + "\n")
	}
	return out.Bytes(), replaced
}

// directory holds the console's users: those of the file, read again when
// it changes (a removed user is logged out at their next request), and
// those of the environment.
type directory struct {
	file string
	env  map[string]User

	mu      sync.Mutex
	users   map[string]User
	modTime time.Time
	size    int64
	// dummy is a hash at the highest cost among the users, to check an
	// unknown name against; floor is how long the recent checks at that
	// cost took: every check lasts at least that long, so neither an
	// unknown name nor a user whose hash is cheaper can be told apart by
	// time.
	dummy []byte
	floor time.Duration
	// checks holds a slot for each password being checked: bcrypt takes
	// a core for a quarter of a second, so logins beyond these wait their
	// turn instead of starving everything else the process does.
	checks chan struct{}
}

// errBusy: too many logins are being checked; the caller should try again.
var errBusy = errors.New("too many logins are being checked at once")

// checkWait is how long a login waits for a slot before errBusy.
const checkWait = 10 * time.Second

func newDirectory(file, env string, allowEmpty bool) (*directory, error) {
	d := &directory{file: file, env: map[string]User{}, checks: make(chan struct{}, max(1, runtime.GOMAXPROCS(0)/2))}
	if env != "" {
		u, err := ParseUsers("SAS_CONSOLE_USERS", []byte(env))
		if err != nil {
			return nil, err
		}
		d.env = u
	}
	if err := d.reload(); err != nil {
		return nil, err
	}
	d.mu.Lock()
	err := d.setDummyLocked() // for the users of the environment alone
	d.mu.Unlock()
	if err != nil {
		return nil, err
	}
	if len(d.all()) == 0 && !allowEmpty {
		return nil, errors.New("no console user: set SAS_CONSOLE_USERS_FILE or SAS_CONSOLE_USERS (sasctl console user add makes one)")
	}
	return d, nil
}

// setDummyLocked makes the dummy hash at the highest cost of the users,
// if it is not at that cost already, and times a check against it.
func (d *directory) setDummyLocked() error {
	top := 0
	for _, m := range []map[string]User{d.env, d.users} {
		for _, u := range m {
			c, _ := bcrypt.Cost(u.hash) // checked by ParseUsers
			top = max(top, c)
		}
	}
	if top == 0 {
		return nil
	}
	if c, err := bcrypt.Cost(d.dummy); err == nil && c == top {
		return nil
	}
	h, err := bcrypt.GenerateFromPassword([]byte("no such user"), top)
	if err != nil {
		return err
	}
	start := time.Now()
	_ = bcrypt.CompareHashAndPassword(h, []byte("not the password"))
	d.dummy, d.floor = h, time.Since(start)
	return nil
}

// reload reads the file again if it changed since it was last read. A
// file that became invalid keeps the users read before.
func (d *directory) reload() error {
	if d.file == "" {
		return nil
	}
	st, err := os.Stat(d.file)
	if err != nil {
		return fmt.Errorf("SAS_CONSOLE_USERS_FILE: %w", err)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.users != nil && st.ModTime().Equal(d.modTime) && st.Size() == d.size {
		return nil
	}
	data, err := os.ReadFile(d.file)
	if err != nil {
		return fmt.Errorf("SAS_CONSOLE_USERS_FILE: %w", err)
	}
	u, err := ParseUsers(d.file, data)
	if err != nil {
		return err
	}
	d.users, d.modTime, d.size = u, st.ModTime(), st.Size()
	if err := d.setDummyLocked(); err != nil {
		return err
	}
	return nil
}

func (d *directory) all() map[string]User {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := make(map[string]User, len(d.users)+len(d.env))
	for k, v := range d.env {
		out[k] = v
	}
	for k, v := range d.users {
		out[k] = v
	}
	return out
}

// lookup returns the user named name as the sources say now.
func (d *directory) lookup(name string) (User, bool) {
	u, ok := d.all()[name]
	return u, ok
}

// authenticate checks name and password, one slot of checks at a time
// (errBusy after checkWait without one). Every check lasts as long as
// one at the highest cost of the users: an unknown name, a wrong
// password and a right one take the same time whatever a user's hash
// costs.
func (d *directory) authenticate(ctx context.Context, name, password string) (User, bool, error) {
	wait := time.NewTimer(checkWait)
	defer wait.Stop()
	select {
	case d.checks <- struct{}{}:
	case <-wait.C:
		return User{}, false, errBusy
	case <-ctx.Done():
		return User{}, false, ctx.Err()
	}
	start := time.Now()
	u, ok := d.lookup(name)
	d.mu.Lock()
	hash, dummy, floor := d.dummy, d.dummy, d.floor
	d.mu.Unlock()
	if ok {
		hash = u.hash
	}
	err := bcrypt.CompareHashAndPassword(hash, []byte(password))
	took := time.Since(start)
	<-d.checks
	if bytesCost(hash) == bytesCost(dummy) {
		// The floor follows the checks at the dearest cost: up at once,
		// down by an eighth a check, so that a check slowed by a busy
		// moment does not leave the others to be told apart.
		d.mu.Lock()
		if bytes.Equal(d.dummy, dummy) {
			d.floor = max(took, d.floor-d.floor/8)
		}
		d.mu.Unlock()
	}
	if took < floor {
		pad := time.NewTimer(floor - took)
		select {
		case <-pad.C:
		case <-ctx.Done():
			pad.Stop()
		}
	}
	if !ok || err != nil {
		return User{}, false, nil
	}
	return u, true, nil
}

func bytesCost(hash []byte) int {
	c, _ := bcrypt.Cost(hash)
	return c
}
