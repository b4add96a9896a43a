// Command idp is a real OpenID Connect provider for the end-to-end
// tests, on loopback: zitadel/oidc's provider (op) with its example
// in-memory storage and login page, its clients issuing JWT access
// tokens and carrying a groups claim. Besides the protocol it serves,
// for the tests only, /test/rotate (a new signing key, the old one kept
// or dropped), /test/mint (claims signed with the current key: expired
// tokens, other audiences) and /test/revoke (a user's sessions ended,
// so their refresh tokens stop working).
package main

import (
	"context"
	"crypto/rand"
	"crypto/rsa"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/go-jose/go-jose/v4"
	"github.com/zitadel/oidc/v3/example/server/exampleop"
	"github.com/zitadel/oidc/v3/example/server/storage"
	"github.com/zitadel/oidc/v3/pkg/oidc"
	"github.com/zitadel/oidc/v3/pkg/op"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "idp:", err)
		os.Exit(1)
	}
}

func run() error {
	env := func(k, def string) string {
		if v := os.Getenv(k); v != "" {
			return v
		}
		return def
	}
	addr := flag.String("addr", env("IDP_ADDR", "127.0.0.1:5556"), "listen address, the issuer being http://ADDR/ (IDP_ADDR)")
	clients := flag.String("clients", env("IDP_CLIENTS", ""), "clients: ID:SECRET:REDIRECT-URI,... each issuing JWT access tokens (IDP_CLIENTS)")
	users := flag.String("users", env("IDP_USERS", ""), "users: ID:NAME:PASSWORD:GROUP+GROUP,... (IDP_USERS)")
	ttl, err := time.ParseDuration(env("IDP_ID_TOKEN_TTL", "1h"))
	if err != nil {
		return fmt.Errorf("IDP_ID_TOKEN_TTL: %w", err)
	}
	idTTL := flag.Duration("id-token-ttl", ttl, "how long ID tokens last (IDP_ID_TOKEN_TTL)")
	flag.Parse()

	issuer := "http://" + *addr + "/"
	st := &store{groups: map[string][]string{}, idTTL: *idTTL}
	us := userStore{}
	for _, u := range strings.Split(*users, ",") {
		f := strings.Split(u, ":")
		if len(f) != 4 {
			return fmt.Errorf("-users: %q is not ID:NAME:PASSWORD:GROUPS", u)
		}
		us[f[0]] = &storage.User{ID: f[0], Username: f[1], Password: f[2], Email: f[1] + "@example.com", EmailVerified: true,
			FirstName: f[1], LastName: "Test"}
		st.groups[f[0]] = strings.Split(f[3], "+")
	}
	cs := map[string]*storage.Client{}
	for _, c := range strings.Split(*clients, ",") {
		f := strings.SplitN(c, ":", 3)
		if len(f) != 3 {
			return fmt.Errorf("-clients: %q is not ID:SECRET:REDIRECT", c)
		}
		cs[f[0]] = storage.WebClient(f[0], f[1], f[2])
		st.clientIDs = append(st.clientIDs, f[0])
	}
	st.Storage = storage.NewStorageWithClients(us, cs)
	if err := st.rotate(true); err != nil {
		return err
	}
	router := exampleop.SetupServer(issuer, st, nil, false)
	mux := http.NewServeMux()
	mux.HandleFunc("POST /test/rotate", func(w http.ResponseWriter, r *http.Request) {
		if err := st.rotate(r.URL.Query().Get("drop") == "1"); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
		}
	})
	mux.HandleFunc("POST /test/mint", st.mint)
	mux.HandleFunc("POST /test/revoke", func(w http.ResponseWriter, r *http.Request) {
		for _, c := range st.clientIDs {
			_ = st.TerminateSession(r.Context(), r.URL.Query().Get("user"), c)
		}
	})
	mux.Handle("/", router)

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	srv := &http.Server{Addr: *addr, Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	errc := make(chan error, 1)
	go func() { errc <- srv.ListenAndServe() }()
	slog.Info("idp listening", "issuer", issuer)
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err = srv.Shutdown(sctx)
	if e := <-errc; !errors.Is(e, http.ErrServerClosed) {
		return e
	}
	return err
}

type userStore map[string]*storage.User

func (u userStore) GetUserByID(id string) *storage.User { return u[id] }
func (u userStore) GetUserByUsername(name string) *storage.User {
	for _, v := range u {
		if v.Username == name {
			return v
		}
	}
	return nil
}
func (u userStore) ExampleClientID() string { return "service" }

// store is the example storage with rotating keys, JWT access tokens, a
// groups claim and a chosen ID token lifetime.
type store struct {
	*storage.Storage
	groups    map[string][]string
	clientIDs []string
	idTTL     time.Duration

	mu   sync.Mutex
	keys []*key // the last signs
}

type key struct {
	id  string
	rsa *rsa.PrivateKey
}

func (k *key) SignatureAlgorithm() jose.SignatureAlgorithm { return jose.RS256 }
func (k *key) Key() any                                    { return k.rsa }
func (k *key) ID() string                                  { return k.id }

type publicKey struct{ k *key }

func (p publicKey) ID() string                         { return p.k.id }
func (p publicKey) Algorithm() jose.SignatureAlgorithm { return jose.RS256 }
func (p publicKey) Use() string                        { return "sig" }
func (p publicKey) Key() any                           { return &p.k.rsa.PublicKey }

func (s *store) rotate(drop bool) error {
	k, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if drop {
		s.keys = nil
	}
	s.keys = append(s.keys, &key{id: fmt.Sprintf("key-%d", time.Now().UnixNano()), rsa: k})
	return nil
}

func (s *store) current() *key {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.keys[len(s.keys)-1]
}

func (s *store) SigningKey(context.Context) (op.SigningKey, error) { return s.current(), nil }

func (s *store) SignatureAlgorithms(context.Context) ([]jose.SignatureAlgorithm, error) {
	return []jose.SignatureAlgorithm{jose.RS256}, nil
}

func (s *store) KeySet(context.Context) ([]op.Key, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]op.Key, len(s.keys))
	for i, k := range s.keys {
		out[i] = publicKey{k}
	}
	return out, nil
}

type client struct {
	op.Client
	idTTL time.Duration
}

func (c client) AccessTokenType() op.AccessTokenType { return op.AccessTokenTypeJWT }
func (c client) IDTokenLifetime() time.Duration      { return c.idTTL }

// IDTokenUserinfoClaimsAssertion puts the profile and email in the ID
// token, as Keycloak, Entra ID, Okta and Google do.
func (c client) IDTokenUserinfoClaimsAssertion() bool { return true }

func (s *store) GetClientByClientID(ctx context.Context, id string) (op.Client, error) {
	c, err := s.Storage.GetClientByClientID(ctx, id)
	if err != nil {
		return nil, err
	}
	return client{c, s.idTTL}, nil
}

func (s *store) SetUserinfoFromScopes(ctx context.Context, ui *oidc.UserInfo, userID, clientID string, scopes []string) error {
	if err := s.Storage.SetUserinfoFromScopes(ctx, ui, userID, clientID, scopes); err != nil {
		return err
	}
	ui.AppendClaims("groups", s.groups[userID])
	return nil
}

func (s *store) GetPrivateClaimsFromScopes(ctx context.Context, userID, clientID string, scopes []string) (map[string]any, error) {
	claims, err := s.Storage.GetPrivateClaimsFromScopes(ctx, userID, clientID, scopes)
	if err != nil {
		return nil, err
	}
	if claims == nil {
		claims = map[string]any{}
	}
	claims["groups"] = s.groups[userID]
	return claims, nil
}

// mint signs the claims posted (a JSON object) with the current key.
func (s *store) mint(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(io.LimitReader(r.Body, 1<<16))
	if err != nil || !json.Valid(body) {
		http.Error(w, "post a JSON object of claims", http.StatusBadRequest)
		return
	}
	k := s.current()
	signer, err := jose.NewSigner(jose.SigningKey{Algorithm: jose.RS256, Key: k.rsa},
		(&jose.SignerOptions{}).WithType("JWT").WithHeader("kid", k.id))
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	jws, err := signer.Sign(body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	out, _ := jws.CompactSerialize()
	_, _ = io.WriteString(w, out)
}
