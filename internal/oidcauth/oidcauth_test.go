package oidcauth

import (
	"errors"
	"maps"
	"slices"
	"strings"
	"testing"
)

func namespaceRule(ns string) error {
	if ns == "" || strings.ContainsAny(ns, " A_") {
		return errors.New("not a namespace name")
	}
	return nil
}

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
		if got := p.grants(c.claims)[DefaultNamespace]; got != c.want {
			t.Errorf("%s: role %q, want %q", c.name, got, c.want)
		}
	}
}

func TestRolesHoldInTheirNamespaces(t *testing.T) {
	p, err := NewProvider(Config{Issuer: "https://idp.example.com", ClientID: "sas", RolesClaim: "groups",
		Roles: "viewers=viewer, a-ops=team-a:operator, a-view=team-a:viewer, b-view=team-b:viewer, admins=*:viewer, root=*:operator"},
		nil, "viewer", "operator")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name    string
		groups  []any
		want    map[string]string
		highest []string
	}{
		{"a role without a namespace is the default one's", []any{"viewers"}, map[string]string{"default": "viewer"}, []string{"default"}},
		{"one namespace, the highest of two", []any{"a-view", "a-ops"}, map[string]string{"team-a": "operator"}, []string{"team-a"}},
		{"two namespaces, two roles", []any{"a-ops", "b-view"}, map[string]string{"team-a": "operator", "team-b": "viewer"}, []string{"team-a"}},
		{"every namespace raises each", []any{"b-view", "root"}, map[string]string{"team-b": "operator", "*": "operator"}, []string{"*", "team-b"}},
		{"every namespace lower than one", []any{"admins", "a-ops"}, map[string]string{"team-a": "operator", "*": "viewer"}, []string{"team-a"}},
		{"nothing", []any{"other"}, nil, nil},
	} {
		g := p.grants(map[string]any{"groups": c.groups})
		if !maps.Equal(g, c.want) {
			t.Errorf("%s: grants %v, want %v", c.name, g, c.want)
			continue
		}
		id := Identity{Grants: g}
		for _, r := range g {
			if id.Role == "" || r == "operator" {
				id.Role = r
			}
		}
		if h := id.Highest(); !slices.Equal(h, c.highest) {
			t.Errorf("%s: highest in %v, want %v", c.name, h, c.highest)
		}
	}
	id := Identity{Grants: map[string]string{"team-a": "operator", "*": "viewer"}}
	if id.RoleIn("team-a") != "operator" || id.RoleIn("team-c") != "viewer" || (Identity{}).RoleIn("default") != "" {
		t.Error("RoleIn")
	}
}

func TestRoleMapsAndSettingsAreChecked(t *testing.T) {
	ok := Config{Issuer: "https://idp.example.com", ClientID: "sas", ClientSecret: "s", RolesClaim: "groups", Roles: "a=viewer"}
	if err := ok.Check(true, namespaceRule, "viewer", "operator"); err != nil {
		t.Fatalf("a good configuration: %v", err)
	}
	if err := (Config{}).Check(true, namespaceRule, "viewer"); err != nil {
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
		{"a role sas does not have in a namespace", with(ok, func(c *Config) { c.Roles = "a=team-a:admin" }), `role "admin"`},
		{"no role after the namespace", with(ok, func(c *Config) { c.Roles = "a=team-a:" }), `role ""`},
		{"a namespace that cannot be", with(ok, func(c *Config) { c.Roles = "a=Team_A:viewer" }), "not a namespace name"},
		{"no namespace before the role", with(ok, func(c *Config) { c.Roles = "a=:viewer" }), "not a namespace name"},
		{"a value twice in one namespace", with(ok, func(c *Config) { c.Roles = "a=viewer,a=default:operator" }), "already"},
		{"not a URL", with(ok, func(c *Config) { c.Issuer = "idp.example.com" }), "http(s) URL"},
		{"the console without a secret", with(ok, func(c *Config) { c.ClientSecret = "" }), "CLIENT_SECRET"},
		{"no claim", with(ok, func(c *Config) { c.RolesClaim = " " }), "ROLES_CLAIM"},
	} {
		err := c.cfg.Check(true, namespaceRule, "viewer", "operator")
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an error saying %q", c.name, err, c.want)
		}
	}
	api := with(ok, func(c *Config) { c.ClientID, c.ClientSecret = "", "" })
	if err := api.Check(false, namespaceRule, "viewer"); err == nil || !strings.Contains(err.Error(), "AUDIENCE") {
		t.Errorf("the API without an audience: %v", err)
	}
	api.Audience = "sas-api"
	if err := api.Check(false, namespaceRule, "viewer"); err != nil {
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
