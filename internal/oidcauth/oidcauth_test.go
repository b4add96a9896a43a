package oidcauth

import (
	"strings"
	"testing"
)

func TestRolesMapTheHighestOfAClaimsValues(t *testing.T) {
	for _, c := range []struct {
		name, claim string
		claims      map[string]any
		want        string
	}{
		{"a list", "groups", map[string]any{"groups": []any{"sas-viewers", "sas-operators", "other"}}, "operator"},
		{"a list, lowest", "groups", map[string]any{"groups": []any{"other", "sas-viewers"}}, "viewer"},
		{"a string", "email", map[string]any{"email": "ann@example.com"}, "operator"},
		{"a nested path (Keycloak)", "realm_access.roles", map[string]any{"realm_access": map[string]any{"roles": []any{"sas-viewers"}}}, "viewer"},
		{"no value maps", "groups", map[string]any{"groups": []any{"other"}}, ""},
		{"the claim is missing", "groups", map[string]any{"roles": []any{"sas-operators"}}, ""},
		{"a path through a non-object", "realm_access.roles", map[string]any{"realm_access": "sas-operators"}, ""},
		{"not strings", "groups", map[string]any{"groups": []any{1, true, map[string]any{}}}, ""},
	} {
		p, err := NewProvider(Config{Issuer: "https://idp.example.com", ClientID: "sas", RolesClaim: c.claim,
			Roles: "sas-viewers=viewer, sas-operators=operator,ann@example.com=operator"}, nil, "viewer", "operator")
		if err != nil {
			t.Fatal(err)
		}
		if got := p.role(c.claims); got != c.want {
			t.Errorf("%s: role %q, want %q", c.name, got, c.want)
		}
	}
}

func TestRoleMapsAndSettingsAreChecked(t *testing.T) {
	ok := Config{Issuer: "https://idp.example.com", ClientID: "sas", ClientSecret: "s", RolesClaim: "groups", Roles: "a=viewer"}
	if err := ok.Check(true, "viewer", "operator"); err != nil {
		t.Fatalf("a good configuration: %v", err)
	}
	if err := (Config{}).Check(true, "viewer"); err != nil {
		t.Fatalf("no issuer is no OIDC: %v", err)
	}
	for _, c := range []struct {
		name string
		cfg  Config
		want string
	}{
		{"a role sas does not have", with(ok, func(c *Config) { c.Roles = "a=admin" }), `role "admin"`},
		{"no pair", with(ok, func(c *Config) { c.Roles = " , " }), "at least one"},
		{"no value", with(ok, func(c *Config) { c.Roles = "=viewer" }), "VALUE=ROLE"},
		{"no equals sign", with(ok, func(c *Config) { c.Roles = "viewer" }), "VALUE=ROLE"},
		{"not a URL", with(ok, func(c *Config) { c.Issuer = "idp.example.com" }), "http(s) URL"},
		{"the console without a secret", with(ok, func(c *Config) { c.ClientSecret = "" }), "CLIENT_SECRET"},
		{"no claim", with(ok, func(c *Config) { c.RolesClaim = " " }), "ROLES_CLAIM"},
	} {
		err := c.cfg.Check(true, "viewer", "operator")
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an error saying %q", c.name, err, c.want)
		}
	}
	api := with(ok, func(c *Config) { c.ClientID, c.ClientSecret = "", "" })
	if err := api.Check(false, "viewer"); err == nil || !strings.Contains(err.Error(), "AUDIENCE") {
		t.Errorf("the API without an audience: %v", err)
	}
	api.Audience = "sas-api"
	if err := api.Check(false, "viewer"); err != nil {
		t.Errorf("the API with an audience and no client: %v", err)
	}
}

func with(c Config, change func(*Config)) Config {
	change(&c)
	return c
}

func TestActorsNameTheProviderAndSubjectWithinBounds(t *testing.T) {
	id := Identity{Issuer: "https://login.example.com/tenant/v2.0", Subject: "AAAAbbbb"}
	if got := id.Actor(); got != "oidc:AAAAbbbb@https://login.example.com/tenant/v2.0" {
		t.Fatalf("actor %q", got)
	}
	long := Identity{Issuer: "https://login.example.com/" + strings.Repeat("t", 200), Subject: strings.Repeat("s", 300)}
	got := long.Actor()
	if len(got) > maxActor || !strings.HasPrefix(got, "oidc:sss") || !strings.HasSuffix(got, "@login.example.com") {
		t.Fatalf("a long actor: %q (%d)", got, len(got))
	}
	if LooksLikeJWT("sas_abc") || !LooksLikeJWT("a.b.c") || LooksLikeJWT("a.b.c.d") {
		t.Fatal("LooksLikeJWT")
	}
}
