package archive

import (
	"context"
	"fmt"
	"time"

	"sas/internal/statestore"
)

// Retain runs one batch of retention through the archive: up to limit
// orders retention would delete now (ended more than olderThan ago;
// statuses as statestore.PurgeEnded's) are each written to a as its
// whole record, and deleted only once a confirmed it keeps it. When a
// put fails, the orders confirmed before it are deleted and the rest
// stay for a later run: an archive that is down holds retention back and
// never loses a record. It returns what was deleted and how many
// documents were written.
func Retain(ctx context.Context, st *statestore.Store, a Archive, olderThan time.Duration, statuses []string, limit int) (statestore.Purged, int, error) {
	ids, err := st.ArchiveCandidates(ctx, olderThan, statuses, limit)
	if err != nil || len(ids) == 0 {
		return statestore.Purged{}, 0, err
	}
	var kept []string
	var putErr error
	for _, id := range ids {
		doc, err := st.ArchiveDocument(ctx, id)
		if err != nil {
			putErr = err
			break
		}
		if err := a.Put(ctx, id, doc); err != nil {
			putErr = fmt.Errorf("the archive did not keep order %s, so retention waits: %w", id, err)
			break
		}
		kept = append(kept, id)
	}
	var p statestore.Purged
	if len(kept) > 0 {
		if p, err = st.PurgeOrders(ctx, kept, olderThan, statuses); err != nil {
			return p, len(kept), err
		}
	}
	return p, len(kept), putErr
}
