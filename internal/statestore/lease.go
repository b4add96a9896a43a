package statestore

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// SupervisorLease is the lease the supervisors' leader holds.
const SupervisorLease = "supervisor"

// Lease is a leadership lease as seen by one contender.
type Lease struct {
	Held   bool   // this contender holds it now
	Holder string // who holds it
	Epoch  int64  // +1 every time it changes hands
	// Remaining is how long it stays valid unless renewed (database clock).
	Remaining time.Duration
}

// AcquireLease takes the named lease for holder for ttl, or renews it if
// holder has it. It succeeds only when the lease is free, expired on the
// database clock, or already holder's; otherwise it reports the current
// holder.
func (s *Store) AcquireLease(ctx context.Context, name, holder string, ttl time.Duration) (Lease, error) {
	return s.acquireLease(ctx, "leases", name, holder, ttl)
}

// ReleaseLease gives the lease up if holder has it, so that a standby can
// take over at once instead of waiting for it to expire.
func (s *Store) ReleaseLease(ctx context.Context, name, holder string) error {
	return s.releaseLease(ctx, "leases", name, holder)
}

// AcquireListenerLease is AcquireLease for a scheduler listener lease
// (SchedulerListenerLease), kept apart from the supervisor's (migration
// 0021).
func (s *Store) AcquireListenerLease(ctx context.Context, name, holder string, ttl time.Duration) (Lease, error) {
	return s.acquireLease(ctx, "listener_leases", name, holder, ttl)
}

// ReleaseListenerLease is ReleaseLease for a scheduler listener lease.
func (s *Store) ReleaseListenerLease(ctx context.Context, name, holder string) error {
	return s.releaseLease(ctx, "listener_leases", name, holder)
}

// acquireLease and releaseLease work on the lease table table, one of the
// two above.
func (s *Store) acquireLease(ctx context.Context, table, name, holder string, ttl time.Duration) (Lease, error) {
	var l Lease
	var remainingMS int64
	err := s.pool.QueryRow(ctx, `
		INSERT INTO `+table+` AS l (name, holder, expires_at)
		VALUES ($1, $2, now() + make_interval(secs => $3::float8))
		ON CONFLICT (name) DO UPDATE
		SET holder = EXCLUDED.holder,
		    expires_at = EXCLUDED.expires_at,
		    epoch = CASE WHEN l.holder = EXCLUDED.holder THEN l.epoch ELSE l.epoch + 1 END,
		    acquired_at = CASE WHEN l.holder = EXCLUDED.holder THEN l.acquired_at ELSE now() END
		WHERE l.holder = EXCLUDED.holder OR l.expires_at < now()
		RETURNING holder, epoch, (extract(epoch FROM expires_at - now()) * 1000)::bigint`,
		name, holder, ttl.Seconds()).Scan(&l.Holder, &l.Epoch, &remainingMS)
	if errors.Is(err, pgx.ErrNoRows) {
		// Someone else holds an unexpired lease.
		err = s.pool.QueryRow(ctx, `SELECT holder, epoch, (extract(epoch FROM expires_at - now()) * 1000)::bigint FROM `+table+` WHERE name = $1`,
			name).Scan(&l.Holder, &l.Epoch, &remainingMS)
		if err != nil {
			return l, fmt.Errorf("read lease %s: %w", name, err)
		}
		l.Remaining = time.Duration(remainingMS) * time.Millisecond
		return l, nil
	}
	if err != nil {
		return l, fmt.Errorf("acquire lease %s: %w", name, err)
	}
	l.Held = true
	l.Remaining = time.Duration(remainingMS) * time.Millisecond
	return l, nil
}

func (s *Store) releaseLease(ctx context.Context, table, name, holder string) error {
	if _, err := s.pool.Exec(ctx, `UPDATE `+table+` SET expires_at = now() - interval '1 millisecond' WHERE name = $1 AND holder = $2`, name, holder); err != nil {
		return fmt.Errorf("release lease %s: %w", name, err)
	}
	return nil
}
