// Package oidcauth signs people and programs in through the company's
// identity provider (OpenID Connect): the console's sign-in (the
// authorization code flow with PKCE, state and nonce) and the API's
// access tokens (JWTs verified by issuer, audience, expiry and the
// provider's rotating keys). A configurable claim (groups, roles, an
// email) maps to sas's roles. Discovery, the key set and the token
// checks are github.com/coreos/go-oidc/v3's; the code exchange and
// refresh are golang.org/x/oauth2's.
package oidcauth

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/coreos/go-oidc/v3/oidc"
	"golang.org/x/oauth2"
)

// Config is the identity provider's settings, shared by the console and
// the API: a field OIDC of their configurations, so SAS_OIDC_ISSUER and
// so on. Issuer unset: no OIDC.
type Config struct {
	// Issuer is the provider's issuer (https://idp.example.com/realms/x),
	// whose /.well-known/openid-configuration says the rest.
	Issuer string `envconfig:"ISSUER"`
	// ClientID and ClientSecret are the console's client at the provider.
	ClientID     string `envconfig:"CLIENT_ID"`
	ClientSecret string `envconfig:"CLIENT_SECRET"`
	// Audience is what the API's access tokens must be for (their aud);
	// unset, the client id.
	Audience string `envconfig:"AUDIENCE"`
	// RolesClaim is the claim read for roles: a name or a dotted path
	// (groups, roles, realm_access.roles, email), a string or a list.
	RolesClaim string `envconfig:"ROLES_CLAIM" default:"groups"`
	// Roles maps the claim's values to sas's roles, each in a namespace:
	// VALUE=ROLE (in the default namespace), VALUE=NAMESPACE:ROLE, or
	// VALUE=*:ROLE (in every namespace), comma-separated; a value may
	// be listed once per namespace (sas-operators=operator,
	// team-a=team-a:operator, sas-admins=*:operator). A person or
	// program with none of the values is refused.
	Roles string `envconfig:"ROLES"`
	// Scopes are asked for at sign-in besides openid.
	Scopes string `envconfig:"SCOPES" default:"profile,email"`
	// Name is what the console's sign-in button calls the provider.
	Name string `envconfig:"NAME" default:"single sign-on"`
}

// On reports whether an issuer is set.
func (c Config) On() bool { return c.Issuer != "" }

// Grant is a role in a namespace (AllNamespaces: every one).
type Grant struct {
	Namespace string
	Role      string
}

// DefaultNamespace is where a role named without a namespace holds, and
// AllNamespaces the namespace of a role in every one.
const (
	DefaultNamespace = "default"
	AllNamespaces    = "*"
)

// RoleMap reads Roles, checking each role against allowed: each value
// of the claim and the roles it grants.
func (c Config) RoleMap(allowed ...string) (map[string][]Grant, error) {
	m := map[string][]Grant{}
	for _, pair := range strings.Split(c.Roles, ",") {
		pair = strings.TrimSpace(pair)
		if pair == "" {
			continue
		}
		value, grant, ok := strings.Cut(pair, "=")
		value, grant = strings.TrimSpace(value), strings.TrimSpace(grant)
		if !ok || value == "" {
			return nil, fmt.Errorf("SAS_OIDC_ROLES: %q is not VALUE=ROLE or VALUE=NAMESPACE:ROLE", pair)
		}
		g := Grant{Namespace: DefaultNamespace, Role: grant}
		if ns, role, scoped := strings.Cut(grant, ":"); scoped {
			g = Grant{Namespace: strings.TrimSpace(ns), Role: strings.TrimSpace(role)}
		}
		if !slices.Contains(allowed, g.Role) {
			return nil, fmt.Errorf("SAS_OIDC_ROLES: %q: role %q is not one of %s", pair, g.Role, strings.Join(allowed, ", "))
		}
		if slices.ContainsFunc(m[value], func(o Grant) bool { return o.Namespace == g.Namespace }) {
			return nil, fmt.Errorf("SAS_OIDC_ROLES: %q: value %q has a role in namespace %q already", pair, value, g.Namespace)
		}
		m[value] = append(m[value], g)
	}
	if len(m) == 0 {
		return nil, errors.New("SAS_OIDC_ROLES must map at least one value of the roles claim to a role (sas-operators=operator)")
	}
	return m, nil
}

// Check reports settings that cannot work; forConsole also needs the
// client's id and secret. namespace is the rule of a namespace's name.
func (c Config) Check(forConsole bool, namespace func(string) error, roles ...string) error {
	if !c.On() {
		return nil
	}
	if !strings.HasPrefix(c.Issuer, "https://") && !strings.HasPrefix(c.Issuer, "http://") {
		return errors.New("SAS_OIDC_ISSUER must be an http(s) URL")
	}
	if forConsole && (c.ClientID == "" || c.ClientSecret == "") {
		return errors.New("SAS_OIDC_CLIENT_ID and SAS_OIDC_CLIENT_SECRET are needed for the console's sign-in")
	}
	if !forConsole && c.ClientID == "" && c.Audience == "" {
		return errors.New("SAS_OIDC_AUDIENCE (or SAS_OIDC_CLIENT_ID) must say what the API's access tokens are for")
	}
	if strings.TrimSpace(c.RolesClaim) == "" {
		return errors.New("SAS_OIDC_ROLES_CLAIM must name a claim")
	}
	m, err := c.RoleMap(roles...)
	if err != nil {
		return err
	}
	for value, grants := range m {
		for _, g := range grants {
			if g.Namespace == AllNamespaces {
				continue
			}
			if err := namespace(g.Namespace); err != nil {
				return fmt.Errorf("SAS_OIDC_ROLES: value %q: %w", value, err)
			}
		}
	}
	return nil
}

// Identity is who a verified token names.
type Identity struct {
	Issuer  string
	Subject string
	// Display is the email, the preferred user name or the subject.
	Display string
	// Role is the highest role the roles claim maps to, in any namespace.
	Role string
	// Grants are its role in each namespace the claim grants one
	// (AllNamespaces: in every one), the highest where several apply.
	Grants map[string]string
	// Expiry is when the token stops being valid.
	Expiry time.Time
}

// Actor is how the history names the identity: the provider and the
// subject, which no API token's or users file's name can be (they
// have no ':').
func (id Identity) Actor() string {
	a := "oidc:" + id.Subject + "@" + id.Issuer
	if len(a) <= maxActor {
		return a
	}
	// Bounded as the store bounds who did a thing: the issuer's host
	// and as much of the subject as fits.
	issuer := id.Issuer
	if u, err := url.Parse(issuer); err == nil && u.Host != "" {
		issuer = u.Host
	}
	sub := id.Subject
	if room := maxActor - len("oidc:@") - len(issuer); len(sub) > room {
		sub = sub[:max(room, 0)]
	}
	a = "oidc:" + sub + "@" + issuer
	return a[:min(len(a), maxActor)]
}

// maxActor bounds an actor's name (the store takes 200 characters, and
// the console and the API put their own word before it).
const maxActor = 180

// asymmetric are the signing algorithms accepted: a key set's public
// keys only, never "none" nor an HMAC keyed with a public key.
var asymmetric = []string{oidc.RS256, oidc.RS384, oidc.RS512, oidc.ES256, oidc.ES384, oidc.ES512,
	oidc.PS256, oidc.PS384, oidc.PS512, oidc.EdDSA}

// Provider is a discovered identity provider. Discovery happens on first
// use and again until it succeeds, so a service starts while its
// provider is away.
type Provider struct {
	cfg    Config
	roles  map[string][]Grant
	rank   []string
	client *http.Client
	// base carries the HTTP client into go-oidc's key fetches, which
	// happen long after discovery: it is never cancelled.
	base context.Context

	mu sync.Mutex
	p  *oidc.Provider
}

// NewProvider returns the provider of cfg; rank lists sas's roles from
// the least to the most, the highest of a person's mapped roles winning.
func NewProvider(cfg Config, client *http.Client, rank ...string) (*Provider, error) {
	roles, err := cfg.RoleMap(rank...)
	if err != nil {
		return nil, err
	}
	if client == nil {
		client = &http.Client{Timeout: 10 * time.Second}
	}
	return &Provider{cfg: cfg, roles: roles, rank: rank, client: client,
		base: oidc.ClientContext(context.Background(), client)}, nil
}

// Name is the provider's name for people.
func (p *Provider) Name() string { return p.cfg.Name }

// Issuer is the provider's issuer.
func (p *Provider) Issuer() string { return p.cfg.Issuer }

func (p *Provider) discovered(ctx context.Context) (*oidc.Provider, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.p != nil {
		return p.p, nil
	}
	// The request's deadline bounds the discovery; the key set keeps
	// p.base for its later fetches.
	dctx, cancel := context.WithTimeout(p.base, 10*time.Second)
	defer cancel()
	stop := context.AfterFunc(ctx, cancel)
	defer stop()
	d, err := oidc.NewProvider(dctx, p.cfg.Issuer)
	if err != nil {
		return nil, fmt.Errorf("%w: discover %s: %w", ErrUnavailable, p.cfg.Issuer, err)
	}
	// NewProvider's key set keeps dctx for its fetches: build the
	// provider again over the never-cancelled base with what was read.
	var meta struct {
		AuthURL       string   `json:"authorization_endpoint"`
		TokenURL      string   `json:"token_endpoint"`
		DeviceAuthURL string   `json:"device_authorization_endpoint"`
		JWKSURL       string   `json:"jwks_uri"`
		UserInfoURL   string   `json:"userinfo_endpoint"`
		Algorithms    []string `json:"id_token_signing_alg_values_supported"`
	}
	if err := d.Claims(&meta); err != nil {
		return nil, fmt.Errorf("read the identity provider's configuration: %w", err)
	}
	pc := oidc.ProviderConfig{IssuerURL: p.cfg.Issuer, AuthURL: meta.AuthURL, TokenURL: meta.TokenURL,
		DeviceAuthURL: meta.DeviceAuthURL, UserInfoURL: meta.UserInfoURL, JWKSURL: meta.JWKSURL, Algorithms: meta.Algorithms}
	p.p = pc.NewProvider(p.base)
	return p.p, nil
}

// ErrUnavailable: the provider's configuration could not be read.
var ErrUnavailable = errors.New("the identity provider cannot be reached")

// ErrNoRole: the token is valid but maps to no role of sas.
var ErrNoRole = errors.New("none of the roles claim's values maps to a role (SAS_OIDC_ROLES)")

// verify checks raw for audience and maps its claims.
func (p *Provider) verify(ctx context.Context, raw, audience string) (Identity, *oidc.IDToken, error) {
	d, err := p.discovered(ctx)
	if err != nil {
		return Identity{}, nil, err
	}
	v := d.Verifier(&oidc.Config{ClientID: audience, SupportedSigningAlgs: asymmetric})
	tok, err := v.Verify(oidc.ClientContext(ctx, p.client), raw)
	if err != nil {
		return Identity{}, nil, err
	}
	var claims map[string]any
	if err := tok.Claims(&claims); err != nil {
		return Identity{}, nil, fmt.Errorf("read the token's claims: %w", err)
	}
	id := Identity{Issuer: tok.Issuer, Subject: tok.Subject, Expiry: tok.Expiry, Display: tok.Subject}
	for _, k := range []string{"preferred_username", "email"} {
		if s, ok := claims[k].(string); ok && s != "" {
			id.Display = s
		}
	}
	id.Grants = p.grants(claims)
	for _, r := range id.Grants {
		if id.Role == "" || slices.Index(p.rank, r) > slices.Index(p.rank, id.Role) {
			id.Role = r
		}
	}
	if id.Role == "" {
		return id, tok, ErrNoRole
	}
	return id, tok, nil
}

// grants are the roles the roles claim's values grant, the highest in
// each namespace; a role in every namespace raises each namespace's.
func (p *Provider) grants(claims map[string]any) map[string]string {
	var v any = claims
	for _, part := range strings.Split(p.cfg.RolesClaim, ".") {
		m, ok := v.(map[string]any)
		if !ok {
			return nil
		}
		v = m[part]
	}
	var values []string
	switch t := v.(type) {
	case string:
		values = []string{t}
	case []any:
		for _, e := range t {
			if s, ok := e.(string); ok {
				values = append(values, s)
			}
		}
	}
	out := map[string]string{}
	raise := func(ns, role string) {
		if cur, ok := out[ns]; !ok || slices.Index(p.rank, role) > slices.Index(p.rank, cur) {
			out[ns] = role
		}
	}
	for _, val := range values {
		for _, g := range p.roles[val] {
			raise(g.Namespace, g.Role)
		}
	}
	if all, ok := out[AllNamespaces]; ok {
		for ns := range out {
			raise(ns, all)
		}
	}
	if len(out) == 0 {
		return nil
	}
	return out
}

// RoleIn is the identity's role in namespace ns ("" for none).
func (id Identity) RoleIn(ns string) string {
	if r, ok := id.Grants[ns]; ok {
		return r
	}
	return id.Grants[AllNamespaces]
}

// Highest are the namespaces where the identity holds its highest role
// (AllNamespaces among them when it holds it in every one), sorted.
func (id Identity) Highest() []string {
	var out []string
	for ns, r := range id.Grants {
		if r == id.Role {
			out = append(out, ns)
		}
	}
	slices.Sort(out)
	return out
}

// VerifyAccess checks an API access token: signed by the provider's
// keys with an asymmetric algorithm, from its issuer, for the API's
// audience, not expired; and maps its roles.
func (p *Provider) VerifyAccess(ctx context.Context, raw string) (Identity, error) {
	aud := p.cfg.Audience
	if aud == "" {
		aud = p.cfg.ClientID
	}
	id, _, err := p.verify(ctx, raw, aud)
	return id, err
}

// LooksLikeJWT reports whether a bearer token has a JWT's three parts
// (sas's own tokens have none).
func LooksLikeJWT(tok string) bool { return strings.Count(tok, ".") == 2 }

// oauth is the client of the console's sign-in.
func (p *Provider) oauth(ctx context.Context, redirect string) (*oauth2.Config, error) {
	d, err := p.discovered(ctx)
	if err != nil {
		return nil, err
	}
	scopes := []string{oidc.ScopeOpenID}
	for _, s := range strings.Split(p.cfg.Scopes, ",") {
		if s = strings.TrimSpace(s); s != "" && s != oidc.ScopeOpenID {
			scopes = append(scopes, s)
		}
	}
	if !slices.Contains(scopes, oidc.ScopeOfflineAccess) {
		scopes = append(scopes, oidc.ScopeOfflineAccess)
	}
	return &oauth2.Config{ClientID: p.cfg.ClientID, ClientSecret: p.cfg.ClientSecret, Endpoint: d.Endpoint(),
		RedirectURL: redirect, Scopes: scopes}, nil
}

// Start is a sign-in begun: where to send the browser, and what the
// callback must see again.
type Start struct {
	URL                    string
	State, Nonce, Verifier string
}

// Begin starts a sign-in that comes back to redirect: fresh state,
// nonce and PKCE verifier (S256).
func (p *Provider) Begin(ctx context.Context, redirect string) (Start, error) {
	oc, err := p.oauth(ctx, redirect)
	if err != nil {
		return Start{}, err
	}
	s := Start{State: oauth2.GenerateVerifier(), Nonce: oauth2.GenerateVerifier(), Verifier: oauth2.GenerateVerifier()}
	s.URL = oc.AuthCodeURL(s.State, oidc.Nonce(s.Nonce), oauth2.S256ChallengeOption(s.Verifier))
	return s, nil
}

// Session is a signed-in person's tokens, kept by the console only.
type Session struct {
	Identity Identity
	// Refresh is the refresh token ("" when the provider gave none).
	Refresh string
}

// Finish exchanges the callback's code (with the PKCE verifier), checks
// the ID token (signature, issuer, audience: the client, expiry) and
// its nonce, and maps its roles.
func (p *Provider) Finish(ctx context.Context, redirect, code string, st Start) (Session, error) {
	oc, err := p.oauth(ctx, redirect)
	if err != nil {
		return Session{}, err
	}
	tok, err := oc.Exchange(oidc.ClientContext(ctx, p.client), code, oauth2.VerifierOption(st.Verifier))
	if err != nil {
		return Session{}, fmt.Errorf("exchange the code: %w", tokenError(err))
	}
	return p.session(ctx, tok, st.Nonce)
}

func (p *Provider) session(ctx context.Context, tok *oauth2.Token, nonce string) (Session, error) {
	raw, ok := tok.Extra("id_token").(string)
	if !ok || raw == "" {
		return Session{}, errors.New("the provider sent no ID token")
	}
	id, idt, err := p.verify(ctx, raw, p.cfg.ClientID)
	if err != nil && !errors.Is(err, ErrNoRole) {
		return Session{}, fmt.Errorf("the ID token: %w", err)
	}
	if nonce != "" && idt.Nonce != nonce {
		return Session{}, errors.New("the ID token's nonce is not this sign-in's")
	}
	return Session{Identity: id, Refresh: tok.RefreshToken}, err
}

// Refresh renews a session with its refresh token: the provider may
// refuse (the person signed out, was disabled, the token revoked), and
// the session then ends.
func (p *Provider) Refresh(ctx context.Context, s Session) (Session, error) {
	if s.Refresh == "" {
		return Session{}, errors.New("the provider gave no refresh token")
	}
	oc, err := p.oauth(ctx, "")
	if err != nil {
		return Session{}, err
	}
	tok, err := oc.TokenSource(oidc.ClientContext(ctx, p.client), &oauth2.Token{RefreshToken: s.Refresh, Expiry: time.Unix(1, 0)}).Token()
	if err != nil {
		return Session{}, fmt.Errorf("refresh: %w", tokenError(err))
	}
	ns, err := p.session(ctx, tok, "")
	if err != nil {
		return Session{}, err
	}
	if ns.Identity.Subject != s.Identity.Subject {
		return Session{}, errors.New("the refreshed ID token names another subject")
	}
	if ns.Refresh == "" {
		ns.Refresh = s.Refresh
	}
	return ns, nil
}

// tokenError keeps the provider's error code and description, never the
// response body as a whole (which could echo a token).
func tokenError(err error) error {
	var re *oauth2.RetrieveError
	if errors.As(err, &re) {
		msg := re.ErrorCode
		if re.ErrorDescription != "" {
			msg += ": " + re.ErrorDescription
		}
		if msg == "" && re.Response != nil {
			msg = re.Response.Status
		}
		return errors.New("the provider refused: " + msg)
	}
	return err
}
