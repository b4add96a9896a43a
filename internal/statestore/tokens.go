package statestore

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"sas/internal/messages"
)

// API token roles (migration 0031): what a token may do.
const (
	TokenSubmitter = "submitter" // submit, and read, await and signal its own orders
	TokenViewer    = "viewer"    // read everything
	TokenOperator  = "operator"  // read everything and act: resubmit, cancel, re-run, bulk jobs, signals
)

// TokenRoles lists the roles a token may have.
func TokenRoles() []string { return []string{TokenSubmitter, TokenViewer, TokenOperator} }

// APIToken is an API token as stored: never its secret.
type APIToken struct {
	ID         int64      `json:"id"`
	Name       string     `json:"name"`
	Role       string     `json:"role"`
	CreatedAt  time.Time  `json:"created_at"`
	CreatedBy  string     `json:"created_by"`
	RevokedAt  *time.Time `json:"revoked_at,omitempty"`
	RevokedBy  string     `json:"revoked_by,omitempty"`
	LastUsedAt *time.Time `json:"last_used_at,omitempty"`
	// Namespaces are those the token acts in; AllNamespaces among them:
	// every one.
	Namespaces []string `json:"namespaces"`
}

// AllNamespaces, granted to a token, lets it act in every namespace.
const AllNamespaces = "*"

// In reports whether the token may act in namespace ns.
func (t APIToken) In(ns string) bool {
	return slices.Contains(t.Namespaces, ns) || slices.Contains(t.Namespaces, AllNamespaces)
}

// CheckNamespace is the rule of a namespace's name: 1 to 63 lower-case
// letters, digits or '-', starting and ending with a letter or digit.
func CheckNamespace(ns string) error { return messages.CheckNamespace(ns) }

// tokenPrefix starts every token, so that a scanner of leaked secrets
// can know one.
const tokenPrefix = "sas_"

// ErrBadToken is why a token is refused: unknown, wrong or revoked (the
// caller is not told which).
var ErrBadToken = errors.New("the token is not valid")

// tokenName is the rule of an API token's name (the table's CHECK says
// the same).
var tokenName = regexp.MustCompile(`^[a-zA-Z0-9][a-zA-Z0-9._-]{0,63}$`)

// CheckTokenName is the rule of an API token's name: 1 to 64 letters,
// digits, . _ or -, starting with a letter or digit.
func CheckTokenName(name string) error {
	if tokenName.MatchString(name) {
		return nil
	}
	return fmt.Errorf("token name %q is not a name: write 1 to 64 letters, digits, . _ or -, starting with a letter or digit", clipText(name, 80))
}

// clipText is s cut to n bytes at a character, for a message.
func clipText(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return strings.ToValidUTF8(s[:n], "") + "…"
}

// CreateAPIToken makes a token named name with role and returns it with
// its secret, the only time the secret is seen: sas_<id>_<secret>. Only
// the SHA-256 of the secret is stored (a secret of 256 random bits needs
// no slow hash).
func (s *Store) CreateAPIToken(ctx context.Context, name, role, by string) (APIToken, string, error) {
	return s.CreateAPITokenIn(ctx, name, role, by, nil)
}

// CreateAPITokenIn is CreateAPIToken for a token that acts in namespaces
// (each one that exists, or AllNamespaces; none: the default one).
func (s *Store) CreateAPITokenIn(ctx context.Context, name, role, by string, namespaces []string) (APIToken, string, error) {
	if len(namespaces) == 0 {
		namespaces = []string{DefaultNamespace}
	}
	if len(namespaces) > 64 {
		return APIToken{}, "", fmt.Errorf("%d namespaces, at most 64: %w", len(namespaces), ErrInvalidData)
	}
	var named []string
	for _, ns := range namespaces {
		if ns == AllNamespaces {
			continue
		}
		if err := CheckNamespace(ns); err != nil {
			return APIToken{}, "", fmt.Errorf("%v: %w", err, ErrInvalidData)
		}
		named = append(named, ns)
	}
	if len(named) > 0 {
		var known []string
		if err := s.pool.QueryRow(ctx, `SELECT coalesce(array_agg(name), '{}') FROM namespaces WHERE name = ANY($1)`, named).Scan(&known); err != nil {
			return APIToken{}, "", fmt.Errorf("read namespaces: %w", classify(err))
		}
		for _, ns := range named {
			if !slices.Contains(known, ns) {
				return APIToken{}, "", fmt.Errorf("there is no namespace %q (sasctl namespaces add %s): %w", ns, ns, ErrNotFound)
			}
		}
	}
	if err := CheckTokenName(name); err != nil {
		return APIToken{}, "", fmt.Errorf("%v: %w", err, ErrInvalidData)
	}
	if !slices.Contains(TokenRoles(), role) {
		return APIToken{}, "", fmt.Errorf("role %q: one of %s: %w", clipText(role, 40), strings.Join(TokenRoles(), ", "), ErrInvalidData)
	}
	raw := make([]byte, 32)
	if _, err := rand.Read(raw); err != nil {
		return APIToken{}, "", fmt.Errorf("make a token: %w", err)
	}
	secret := base64.RawURLEncoding.EncodeToString(raw)
	sum := sha256.Sum256([]byte(secret))
	var t APIToken
	err := s.pool.QueryRow(ctx, `INSERT INTO api_tokens (name, role, secret_hash, created_by, namespaces) VALUES ($1, $2, $3, $4, $5)
		RETURNING id, name, role, created_at, created_by, namespaces`, name, role, sum[:], by, namespaces).
		Scan(&t.ID, &t.Name, &t.Role, &t.CreatedAt, &t.CreatedBy, &t.Namespaces)
	if err != nil {
		if pgErr := (*pgconn.PgError)(nil); errors.As(err, &pgErr) && pgErr.Code == "23505" {
			return APIToken{}, "", fmt.Errorf("a token named %q exists already (names are never reused): %w", name, ErrConflict)
		}
		return APIToken{}, "", fmt.Errorf("create token %q: %w", name, classify(err))
	}
	return t, tokenPrefix + strconv.FormatInt(t.ID, 10) + "_" + secret, nil
}

// APITokenOf checks a token as a client presents it and returns what it
// is; ErrBadToken for one that is malformed, unknown, wrong or revoked.
func (s *Store) APITokenOf(ctx context.Context, token string) (APIToken, error) {
	id, secret, ok := splitToken(token)
	if !ok {
		return APIToken{}, ErrBadToken
	}
	var t APIToken
	var hash []byte
	err := s.pool.QueryRow(ctx, `SELECT id, name, role, created_at, created_by, revoked_at, secret_hash, namespaces FROM api_tokens WHERE id = $1`, id).
		Scan(&t.ID, &t.Name, &t.Role, &t.CreatedAt, &t.CreatedBy, &t.RevokedAt, &hash, &t.Namespaces)
	if errors.Is(err, pgx.ErrNoRows) {
		return APIToken{}, ErrBadToken
	}
	if err != nil {
		return APIToken{}, fmt.Errorf("read token %d: %w", id, classify(err))
	}
	sum := sha256.Sum256([]byte(secret))
	if subtle.ConstantTimeCompare(sum[:], hash) != 1 || t.RevokedAt != nil {
		return APIToken{}, ErrBadToken
	}
	return t, nil
}

// splitToken reads sas_<id>_<secret>.
func splitToken(token string) (int64, string, bool) {
	rest, ok := strings.CutPrefix(token, tokenPrefix)
	if !ok || len(token) > 200 {
		return 0, "", false
	}
	idText, secret, ok := strings.Cut(rest, "_")
	if !ok || secret == "" || len(idText) > 18 {
		return 0, "", false
	}
	id, err := strconv.ParseInt(idText, 10, 64)
	if err != nil || id < 1 {
		return 0, "", false
	}
	return id, secret, true
}

// TouchAPITokens records that the tokens ids were used (at most once a
// minute each, so that a busy token does not write a row per request).
func (s *Store) TouchAPITokens(ctx context.Context, ids []int64) error {
	_, err := s.pool.Exec(ctx, `UPDATE api_tokens SET last_used_at = now()
		WHERE id = ANY($1) AND (last_used_at IS NULL OR last_used_at < now() - interval '1 minute')`, ids)
	if err != nil {
		return fmt.Errorf("touch tokens: %w", classify(err))
	}
	return nil
}

// APITokens lists every token, revoked ones too, oldest first.
func (s *Store) APITokens(ctx context.Context) ([]APIToken, error) {
	rows, err := s.pool.Query(ctx, `SELECT id, name, role, created_at, created_by, revoked_at, coalesce(revoked_by, ''), last_used_at, namespaces
		FROM api_tokens ORDER BY id`)
	if err != nil {
		return nil, fmt.Errorf("list tokens: %w", classify(err))
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (APIToken, error) {
		var t APIToken
		err := row.Scan(&t.ID, &t.Name, &t.Role, &t.CreatedAt, &t.CreatedBy, &t.RevokedAt, &t.RevokedBy, &t.LastUsedAt, &t.Namespaces)
		return t, err
	})
	if err != nil {
		return nil, fmt.Errorf("list tokens: %w", classify(err))
	}
	return out, nil
}

// RevokeAPIToken revokes the token named name: it is refused from then on
// (by an API replica within its token cache's time). Revoking a revoked
// token changes nothing; an unknown name is ErrNotFound.
func (s *Store) RevokeAPIToken(ctx context.Context, name, by string) (APIToken, error) {
	var t APIToken
	err := s.pool.QueryRow(ctx, `UPDATE api_tokens SET revoked_at = coalesce(revoked_at, now()), revoked_by = coalesce(revoked_by, $2)
		WHERE name = $1 RETURNING id, name, role, created_at, created_by, revoked_at, revoked_by, namespaces`, name, by).
		Scan(&t.ID, &t.Name, &t.Role, &t.CreatedAt, &t.CreatedBy, &t.RevokedAt, &t.RevokedBy, &t.Namespaces)
	if errors.Is(err, pgx.ErrNoRows) {
		return APIToken{}, fmt.Errorf("no token is named %q: %w", name, ErrNotFound)
	}
	if err != nil {
		return APIToken{}, fmt.Errorf("revoke token %q: %w", name, classify(err))
	}
	return t, nil
}
