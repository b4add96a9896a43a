package e2e

import (
	"context"
	"crypto/hmac"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"io"
	"math/big"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"golang.org/x/oauth2"

	"sas/internal/harness/testenv"
	"sas/internal/statestore"
)

// idpSecret is the console's client secret at the test provider.
const idpSecret = "console-client-secret-8d1f"

// idpProc is the test identity provider (internal/harness/idp): a real
// OpenID Connect provider on loopback.
type idpProc struct {
	*proc
	issuer string
}

// startIdP starts the provider with a client for a console at
// consoleAddr (and another client), and four people: ann (group
// sas-operators), bob (sas-viewers), eve (a group sas maps to nothing)
// and cat (team-a-ops). Its ID tokens last idTTL.
func startIdP(t *testing.T, consoleAddr, idTTL string) idpProc {
	t.Helper()
	p := launch(t, "idp", []string{
		"IDP_CLIENTS=sas:" + idpSecret + ":http://" + consoleAddr + "/login/oidc/callback,other:other-secret:http://127.0.0.1:9/cb",
		"IDP_USERS=id1:ann:ann-pw:sas-operators,id2:bob:bob-pw:sas-viewers,id3:eve:eve-pw:elsewhere,id4:cat:cat-pw:team-a-ops",
		"IDP_ID_TOKEN_TTL=" + idTTL}, "IDP_ADDR")
	i := idpProc{proc: p, issuer: "http://" + p.ops + "/"}
	testenv.Eventually(t, 30*time.Second, "the identity provider to serve", func() bool {
		if p.exited() {
			t.Fatalf("idp exited: %v\n%s", p.err, p.tail())
		}
		resp, err := http.Get(i.issuer + ".well-known/openid-configuration")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	return i
}

var idpFormID = regexp.MustCompile(`name="id" value="([^"]+)"`)

// authorize goes through the provider from an authorization URL as a
// browser would, signing in at its login form, and returns the URL the
// provider sends the browser back to (with the code and state).
func (i idpProc) authorize(t *testing.T, authURL, user, password string) string {
	t.Helper()
	c := &http.Client{Timeout: 30 * time.Second, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	next := authURL
	for range 12 {
		if !strings.HasPrefix(next, i.issuer) {
			return next
		}
		resp, err := c.Get(next)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if m := idpFormID.FindSubmatch(body); resp.StatusCode == http.StatusOK && m != nil {
			resp, err = c.PostForm(i.issuer+"login/username", url.Values{"id": {string(m[1])}, "username": {user}, "password": {password}})
			if err != nil {
				t.Fatal(err)
			}
			body, _ = io.ReadAll(resp.Body)
			resp.Body.Close()
		}
		loc, err := resp.Location()
		if err != nil {
			t.Fatalf("the provider answered %d without a redirect:\n%s", resp.StatusCode, body)
		}
		next = loc.String()
	}
	t.Fatalf("the provider never sent the browser back")
	return ""
}

// tokens signs user in through client at the provider (code flow with
// PKCE) and returns the tokens.
func (i idpProc) tokens(t *testing.T, client, secret, redirect, user, password string) *oauth2.Token {
	t.Helper()
	oc := oauth2.Config{ClientID: client, ClientSecret: secret, RedirectURL: redirect, Scopes: []string{"openid", "profile", "email"},
		Endpoint: oauth2.Endpoint{AuthURL: i.issuer + "auth", TokenURL: i.issuer + "oauth/token"}}
	verifier := oauth2.GenerateVerifier()
	back, err := url.Parse(i.authorize(t, oc.AuthCodeURL("a-state", oauth2.S256ChallengeOption(verifier)), user, password))
	if err != nil {
		t.Fatal(err)
	}
	tok, err := oc.Exchange(context.Background(), back.Query().Get("code"), oauth2.VerifierOption(verifier))
	if err != nil {
		t.Fatalf("exchange the code: %v", err)
	}
	return tok
}

// post calls one of the provider's test routes.
func (i idpProc) post(t *testing.T, path, body string) string {
	t.Helper()
	resp, err := http.Post(i.issuer+path, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("POST %s: %d %s", path, resp.StatusCode, b)
	}
	return string(b)
}

// ssoBegin starts a console sign-in and returns where the console sends
// the browser.
func ssoBegin(t *testing.T, c *webClient) string {
	t.Helper()
	if status, _ := c.do("GET", "/login/oidc?next=/orders", nil); status != http.StatusSeeOther {
		t.Fatalf("GET /login/oidc: %d", status)
	}
	return c.last.Header.Get("Location")
}

// ssoSignIn signs c in as user through the provider and returns the
// callback's status, its page and the callback's path and query.
func ssoSignIn(t *testing.T, c *webClient, idp idpProc, user, password string) (int, string, string) {
	t.Helper()
	back, err := url.Parse(idp.authorize(t, ssoBegin(t, c), user, password))
	if err != nil {
		t.Fatal(err)
	}
	status, page := c.do("GET", back.RequestURI(), nil)
	return status, page, back.RequestURI()
}

// TestSingleSignOnAtARealProvider: the console signs people in at a real
// OpenID Connect provider (a browser through its login page; code flow
// with PKCE, state and nonce), maps their groups to roles, records their
// actions with the subject and the provider, renews sessions with the
// refresh token and ends them when the provider stops renewing; forged,
// missing and replayed callbacks fail closed. The API takes the
// provider's access tokens beside its own, follows a key rotation, and
// refuses expired tokens, tokens for another audience or issuer, "alg:
// none", an HMAC keyed with the public key, and people with no role,
// each with a log line that holds no token.
func TestSingleSignOnAtARealProvider(t *testing.T) {
	t.Parallel()
	s := newStack(t)
	consoleAddr := freeAddr(t)
	idp := startIdP(t, consoleAddr, "3s")
	oidcEnv := []string{"SAS_OIDC_ISSUER=" + idp.issuer, "SAS_OIDC_CLIENT_ID=sas", "SAS_OIDC_CLIENT_SECRET=" + idpSecret,
		"SAS_OIDC_ROLES=sas-operators=operator,sas-viewers=viewer,team-a-ops=team-a:operator,every-viewer=*:viewer", "SAS_OIDC_NAME=Example SSO"}
	base := "http://" + consoleAddr
	console := start(t, "console", append(append(append([]string{}, s.env...), "SAS_DATABASE_URL="+consoleLogin(t, s),
		"SAS_CONSOLE_ADDR="+consoleAddr, "SAS_CONSOLE_PUBLIC_URL="+base), oidcEnv...))
	store := statestore.New(s.pool)
	order := orphanOrder()
	if got, err := store.InsertOrder(t.Context(), order); err != nil || got != statestore.Inserted {
		t.Fatalf("insert: %v %v", got, err)
	}

	// In a browser: the login page offers the provider (and no password
	// form: there is no users file); its login page signs ann in.
	ctx := browser(t)
	do(t, ctx, "sign in at the provider", chromedp.Navigate(base+"/orders"), chromedp.WaitVisible(chromedp.CSS("#sso")))
	if n := eval[int](t, ctx, `document.querySelectorAll("#password").length`); n != 0 {
		t.Fatalf("the login page shows a password form without a users file")
	}
	do(t, ctx, "the provider's login page", chromedp.Click(chromedp.CSS("#sso")), chromedp.WaitVisible(chromedp.CSS("#username")),
		chromedp.SendKeys(chromedp.CSS("#username"), "ann"), chromedp.SendKeys(chromedp.CSS("#password"), "ann-pw"),
		chromedp.Click(chromedp.CSS(`button[type="submit"]`)), chromedp.WaitVisible(chromedp.CSS("#user")))
	if u, r := text(t, ctx, "#user"), text(t, ctx, ".badge.role"); u != "ann@example.com" || r != "operator" {
		t.Fatalf("signed in as %q (%q), want ann@example.com, operator", u, r)
	}
	if loc := value(t, ctx, "location", chromedp.Location()); loc != base+"/orders" {
		t.Fatalf("after the sign-in the browser is at %s, want the page it asked for", loc)
	}

	// Over HTTP: an operator's action records the subject and provider.
	ann := newWebClient(t, base)
	ann.origin = base
	status, page, callback := ssoSignIn(t, ann, idp, "ann", "ann-pw")
	if status != http.StatusOK || !strings.Contains(page, `data-follow href="/orders"`) {
		t.Fatalf("callback: %d\n%s", status, page)
	}
	_, page = ann.do("GET", "/orders/"+order.OrderID+"/pause", nil)
	if status, _ := ann.do("POST", "/orders/"+order.OrderID+"/pause", url.Values{"csrf": {csrfOf(t, page)}}); status != http.StatusSeeOther {
		t.Fatalf("pause as ann: %d", status)
	}
	var by string
	if err := s.pool.QueryRow(t.Context(), `SELECT paused_by FROM order_pauses WHERE order_id = $1`, order.OrderID).Scan(&by); err != nil {
		t.Fatal(err)
	}
	if want := "console:oidc:id1@" + idp.issuer + " ("; !strings.HasPrefix(by, want) {
		t.Fatalf("the pause is recorded as by %q, want %q and the database login", by, want)
	}

	// The same callback again: its state was used (with the cookie put
	// back, or without it).
	for _, withCookie := range []bool{false, true} {
		if withCookie {
			st, _ := url.Parse(callback)
			ann.cookies["sas_sso"] = &http.Cookie{Name: "sas_sso", Value: st.Query().Get("state")}
		}
		if status, _ := ann.do("GET", callback, nil); status != http.StatusForbidden {
			t.Fatalf("a replayed callback (cookie %v): %d, want 403", withCookie, status)
		}
	}

	// The ID token lasts 3 s: the session is renewed at the provider and
	// goes on; once the provider ends ann's sessions, it ends too.
	testenv.Eventually(t, 30*time.Second, "the session to be renewed", func() bool {
		if status, _ := ann.do("GET", "/orders", nil); status != http.StatusOK {
			t.Fatalf("a renewed session lost: %d", status)
		}
		return console.metric(t, `sas_console_sso_total{result="refreshed"}`) > 0
	})
	idp.post(t, "test/revoke?user=id1", "")
	testenv.Eventually(t, 30*time.Second, "the session to end", func() bool {
		status, _ := ann.do("GET", "/orders", nil)
		return status == http.StatusSeeOther && strings.HasPrefix(ann.last.Header.Get("Location"), "/login")
	})

	// Forged and missing state, a code used before: refused.
	forged := newWebClient(t, base)
	back, _ := url.Parse(idp.authorize(t, ssoBegin(t, forged), "ann", "ann-pw"))
	q := back.Query()
	usedCode := q.Get("code")
	q.Set("state", "forged-state")
	if status, _ := forged.do("GET", back.Path+"?"+q.Encode(), nil); status != http.StatusForbidden {
		t.Fatalf("a forged state: %d, want 403", status)
	}
	if status, _ := forged.do("GET", back.Path+"?code="+url.QueryEscape(usedCode), nil); status != http.StatusForbidden {
		t.Fatalf("no state: %d, want 403", status)
	}
	replay := newWebClient(t, base)
	if status, _, _ := ssoSignIn(t, replay, idp, "ann", "ann-pw"); status != http.StatusOK {
		t.Fatalf("sign-in: %d", status)
	}
	fresh, _ := url.Parse(ssoBegin(t, replay))
	if status, _ := replay.do("GET", "/login/oidc/callback?state="+url.QueryEscape(fresh.Query().Get("state"))+"&code="+url.QueryEscape(usedCode), nil); status != http.StatusUnauthorized {
		t.Fatalf("a code used before, with a fresh state: %d, want 401", status)
	}

	// bob is a viewer; eve maps to no role.
	bob := newWebClient(t, base)
	bob.origin = base
	if status, _, _ := ssoSignIn(t, bob, idp, "bob", "bob-pw"); status != http.StatusOK {
		t.Fatalf("bob's sign-in: %d", status)
	}
	if status, _ := bob.do("POST", "/orders/"+order.OrderID+"/resume", url.Values{"csrf": {"x"}}); status != http.StatusForbidden {
		t.Fatalf("a viewer's action: %d, want 403", status)
	}
	if status, _, _ := ssoSignIn(t, newWebClient(t, base), idp, "eve", "eve-pw"); status != http.StatusForbidden {
		t.Fatalf("eve's sign-in: %d, want 403", status)
	}
	if n := console.metric(t, `sas_console_sso_total{result="refused"}`); n < 5 {
		t.Fatalf("%v sign-ins counted refused, want at least 5", n)
	}
	log := console.logText()
	for _, secret := range []string{idpSecret, usedCode} {
		if strings.Contains(log, secret) {
			t.Fatalf("the console's log holds a secret (%.6s…)", secret)
		}
	}
	if !strings.Contains(log, "console sign-in refused") || !strings.Contains(log, "console session ended") {
		t.Fatalf("the console's log does not say why sign-ins were refused and the session ended:\n%s", console.tail())
	}

	// The API: the provider's access tokens beside sas's own.
	api := startAPI(t, s, "", oidcEnv...)
	redirect := base + "/login/oidc/callback"
	annTok := idp.tokens(t, "sas", idpSecret, redirect, "ann", "ann-pw").AccessToken
	bobTok := idp.tokens(t, "sas", idpSecret, redirect, "bob", "bob-pw").AccessToken
	if code, _, b := api.call(t, apiCall{method: "GET", path: "/api/v1/orders/" + order.OrderID, token: annTok}); code != http.StatusOK {
		t.Fatalf("ann's access token: %d %s", code, b)
	}
	if code, _, b := api.call(t, apiCall{method: "POST", path: "/api/v1/orders/" + order.OrderID + "/resume", token: bobTok}); code != http.StatusForbidden {
		t.Fatalf("a viewer's action: %d %s", code, b)
	}
	if code, _, b := api.call(t, apiCall{method: "POST", path: "/api/v1/orders/" + order.OrderID + "/resume", token: annTok}); code != http.StatusOK {
		t.Fatalf("an operator's action: %d %s", code, b)
	}
	if n := s.count(t, `SELECT count(*) FROM order_pauses WHERE order_id = $1`, order.OrderID); n != 0 {
		t.Fatalf("the order is still paused after ann resumed it")
	}
	// The provider rotates its key: a token signed with the new one is
	// taken (the API fetches the keys again).
	idp.post(t, "test/rotate?drop=1", "")
	rotated := idp.tokens(t, "sas", idpSecret, redirect, "ann", "ann-pw").AccessToken
	eveTok := idp.tokens(t, "sas", idpSecret, redirect, "eve", "eve-pw").AccessToken
	if code, _, b := api.call(t, apiCall{method: "GET", path: "/api/v1/orders/" + order.OrderID, token: rotated}); code != http.StatusOK {
		t.Fatalf("a token signed with the rotated key: %d %s", code, b)
	}

	now := time.Now().Unix()
	claims := func(change map[string]any) string {
		c := map[string]any{"iss": idp.issuer, "sub": "id1", "aud": "sas", "iat": now, "exp": now + 300, "groups": []string{"sas-operators"}}
		for k, v := range change {
			c[k] = v
		}
		b, _ := json.Marshal(c)
		return string(b)
	}
	minted := idp.post(t, "test/mint", claims(nil))
	if code, _, b := api.call(t, apiCall{method: "GET", path: "/api/v1/orders/" + order.OrderID, token: minted}); code != http.StatusOK {
		t.Fatalf("a token the provider signed: %d %s", code, b)
	}
	hdr, payload := jwtPart(`{"alg":"none","typ":"JWT"}`), jwtPart(claims(nil))
	pubPEM := providerKeyPEM(t, idp)
	mac := hmac.New(sha256.New, pubPEM)
	hsHdr := jwtPart(`{"alg":"HS256","typ":"JWT"}`)
	mac.Write([]byte(hsHdr + "." + payload))
	bad := map[string]string{
		"expired":              idp.post(t, "test/mint", claims(map[string]any{"exp": now - 60, "iat": now - 120})),
		"another audience":     idp.post(t, "test/mint", claims(map[string]any{"aud": "other"})),
		"another issuer":       idp.post(t, "test/mint", claims(map[string]any{"iss": "http://127.0.0.1:9/"})),
		"alg none":             hdr + "." + payload + ".",
		"HMAC with the public": hsHdr + "." + payload + "." + base64.RawURLEncoding.EncodeToString(mac.Sum(nil)),
		"tampered":             tamper(minted, jwtPart(claims(map[string]any{"sub": "id2"}))),
	}
	for what, tok := range bad {
		code, _, b := api.call(t, apiCall{method: "GET", path: "/api/v1/orders/" + order.OrderID, token: tok})
		if code != http.StatusUnauthorized {
			t.Errorf("a token (%s): %d %s, want 401", what, code, b)
		}
	}
	if code, _, b := api.call(t, apiCall{method: "GET", path: "/api/v1/orders/" + order.OrderID, token: eveTok}); code != http.StatusForbidden ||
		!strings.Contains(string(b), "grants no role") {
		t.Errorf("a valid token that maps to no role: %d %s, want 403", code, b)
	}
	// Roles in namespaces: team-a's operators act in team-a alone; with a
	// role in every namespace too, a request names the namespace it acts
	// in (Sas-Namespace) and has its role there.
	if out, errOut, code := sasctl(t, s.env, "namespaces", "add", "team-a"); code != 0 {
		t.Fatalf("namespaces add: %s %s", out, errOut)
	}
	orderA := orphanOrder()
	orderA.Namespace = "team-a"
	if got, err := store.InsertOrder(t.Context(), orderA); err != nil || got != statestore.Inserted {
		t.Fatalf("insert: %v %v", got, err)
	}
	teamTok := idp.post(t, "test/mint", claims(map[string]any{"groups": []string{"team-a-ops"}}))
	bothTok := idp.post(t, "test/mint", claims(map[string]any{"groups": []string{"team-a-ops", "every-viewer"}}))
	for _, c := range []struct {
		what, tok, method, id, ns, verb string
		want                            int
	}{
		{"team-a's operator reads team-a's order", teamTok, "GET", orderA.OrderID, "", "", http.StatusOK},
		{"team-a's operator pauses it", teamTok, "POST", orderA.OrderID, "", "/pause", http.StatusOK},
		{"team-a's operator reads the default namespace's", teamTok, "GET", order.OrderID, "", "", http.StatusNotFound},
		{"team-a's operator names the default namespace", teamTok, "GET", order.OrderID, "default", "", http.StatusForbidden},
		{"a viewer of every namespace, naming none, acts as team-a's operator", bothTok, "GET", order.OrderID, "", "", http.StatusNotFound},
		{"naming the default namespace, it reads there", bothTok, "GET", order.OrderID, "default", "", http.StatusOK},
		{"naming the default namespace, it may only read", bothTok, "POST", order.OrderID, "default", "/pause", http.StatusForbidden},
		{"naming team-a, it acts there", bothTok, "POST", orderA.OrderID, "team-a", "/resume", http.StatusOK},
		{"naming team-a, not another's order", bothTok, "GET", order.OrderID, "team-a", "", http.StatusNotFound},
	} {
		call := apiCall{method: c.method, path: "/api/v1/orders/" + c.id + c.verb, token: c.tok}
		if c.method == "POST" {
			call.body = "{}"
		}
		if c.ns != "" {
			call.header = map[string]string{"Sas-Namespace": c.ns}
		}
		if code, _, b := api.call(t, call); code != c.want {
			t.Errorf("%s: %d %s, want %d", c.what, code, b, c.want)
		}
	}
	if n := s.count(t, `SELECT count(*) FROM order_pauses WHERE order_id = $1`, order.OrderID); n != 0 {
		t.Errorf("a viewer paused the default namespace's order")
	}
	// In the console too: cat, of team-a's operators, looks at team-a.
	cat := newWebClient(t, base)
	if status, _, _ := ssoSignIn(t, cat, idp, "cat", "cat-pw"); status != http.StatusOK {
		t.Fatalf("cat's sign-in: %d", status)
	}
	if status, page := cat.do("GET", "/orders", nil); status != http.StatusOK || !strings.Contains(page, orderA.OrderID) ||
		strings.Contains(page, order.OrderID) || !strings.Contains(page, `id="namespace-only">team-a<`) {
		t.Errorf("cat's orders: %d\n%s", status, page)
	}
	if status, _ := cat.do("GET", "/orders/"+order.OrderID, nil); status != http.StatusNotFound {
		t.Errorf("cat opening the default namespace's order: %d, want 404", status)
	}
	if n := s.count(t, `SELECT count(*) FROM operator_actions WHERE target = $1 AND claimed_by LIKE 'api:oidc:id1@%'`, orderA.OrderID); n != 2 {
		t.Errorf("team-a's order's history records %d actions by the identity, want its pause and resume", n)
	}

	apiLog := api.logText()
	if n := strings.Count(apiLog, "access token refused"); n < len(bad)+1 {
		t.Errorf("the API's log has %d lines of refused tokens, want %d:\n%s", n, len(bad)+1, api.tail())
	}
	for what, tok := range bad {
		if _, sig, _ := strings.Cut(tok[strings.LastIndex(tok, "."):], "."); len(sig) > 8 && strings.Contains(apiLog, sig) {
			t.Errorf("the API's log holds the signature of a presented token (%s)", what)
		}
	}
	for _, tok := range []string{annTok, bobTok, rotated} {
		if strings.Contains(apiLog, tok[strings.LastIndex(tok, ".")+1:]) {
			t.Errorf("the API's log holds an access token")
		}
	}
}

// tamper puts another payload between a signed token's header and
// signature.
func tamper(tok, payload string) string {
	parts := strings.Split(tok, ".")
	parts[1] = payload
	return strings.Join(parts, ".")
}

func jwtPart(s string) string { return base64.RawURLEncoding.EncodeToString([]byte(s)) }

// providerKeyPEM is the provider's current public key as PEM: what an
// attacker keys an HMAC with, hoping a verifier takes it for a secret.
func providerKeyPEM(t *testing.T, idp idpProc) []byte {
	t.Helper()
	resp, err := http.Get(idp.issuer + "keys")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var set struct {
		Keys []struct{ N, E string }
	}
	if err := json.NewDecoder(resp.Body).Decode(&set); err != nil || len(set.Keys) == 0 {
		t.Fatalf("the provider's keys: %v", err)
	}
	n, _ := base64.RawURLEncoding.DecodeString(set.Keys[0].N)
	e, _ := base64.RawURLEncoding.DecodeString(set.Keys[0].E)
	pub := &rsa.PublicKey{N: new(big.Int).SetBytes(n), E: int(new(big.Int).SetBytes(e).Int64())}
	der, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der})
}
