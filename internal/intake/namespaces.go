package intake

import (
	"context"
	"slices"
	"sync"
	"time"

	"sas/internal/statestore"
)

// Namespaces keeps the deployment's namespaces, and which of them have
// quotas, for a few seconds: what an entrance that writes orders (the API,
// the submitter) asks of each one. A namespace just added is found at
// once (a name not known is read again); a quota set holds on every
// replica within NamespacesFor.
type Namespaces struct {
	read func(ctx context.Context) ([]statestore.Namespace, error)
	now  func() time.Time

	mu     sync.Mutex
	names  []string
	quotas map[string]bool
	until  time.Time
}

// NamespacesFor is how long the namespaces read are trusted.
const NamespacesFor = 5 * time.Second

// NewNamespaces reads the namespaces with read (statestore's Namespaces).
func NewNamespaces(read func(ctx context.Context) ([]statestore.Namespace, error)) *Namespaces {
	return &Namespaces{read: read, now: time.Now}
}

// Names are the deployment's namespaces, from what was read while it is
// fresh (or read again, with fresh).
func (n *Namespaces) Names(ctx context.Context, fresh bool) ([]string, error) {
	n.mu.Lock()
	names, ok := n.names, n.now().Before(n.until)
	n.mu.Unlock()
	if ok && !fresh {
		return names, nil
	}
	all, err := n.read(ctx)
	if err != nil {
		return nil, err
	}
	names = make([]string, len(all))
	quotas := map[string]bool{}
	for i, ns := range all {
		names[i] = ns.Name
		if ns.Any() {
			quotas[ns.Name] = true
		}
	}
	n.mu.Lock()
	n.names, n.quotas, n.until = names, quotas, n.now().Add(NamespacesFor)
	n.mu.Unlock()
	return names, nil
}

// Exists reports whether ns is a namespace.
func (n *Namespaces) Exists(ctx context.Context, ns string) (bool, error) {
	for _, fresh := range []bool{false, true} {
		names, err := n.Names(ctx, fresh)
		if err != nil || slices.Contains(names, ns) {
			return err == nil, err
		}
	}
	return false, nil
}

// Quotas reports whether namespace ns has quotas (the default one has
// none).
func (n *Namespaces) Quotas(ctx context.Context, ns string) (bool, error) {
	if ns == statestore.DefaultNamespace {
		return false, nil
	}
	if _, err := n.Names(ctx, false); err != nil {
		return false, err
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.quotas[ns], nil
}
