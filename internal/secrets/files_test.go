package secrets_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"sas/internal/secrets"
)

func TestPasswordFiles(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	db := write("db", "not/a#real@Secret:%? \n")
	amqp := write("amqp", "crlf\r\n")
	svc := write("svc", "two\nlines")
	got, err := secrets.PasswordFiles([]string{
		"SAS_DATABASE_PASSWORD_FILE=" + db,
		"SAS_AMQP_PASSWORD_FILE=" + amqp,
		"SAS_DB_PASSWORD_SUBMITTER_FILE=" + svc,
		"SAS_OIDC_CLIENT_SECRET_FILE=" + amqp,
		// Settings that name files but hold no password are left alone.
		"SAS_CONSOLE_USERS_FILE=/nowhere",
		"SAS_WORKFLOWS_FILE=/nowhere",
		"OTHER_PASSWORD_FILE=/nowhere",
	})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		"SAS_DATABASE_PASSWORD":     "not/a#real@Secret:%? ",
		"SAS_AMQP_PASSWORD":         "crlf",
		"SAS_DB_PASSWORD_SUBMITTER": "two\nlines",
		"SAS_OIDC_CLIENT_SECRET":    "crlf",
	}
	if len(got) != len(want) {
		t.Fatalf("got %q, want %q", got, want)
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s = %q, want %q", k, got[k], v)
		}
	}

	for _, c := range []struct {
		environ []string
		want    string
	}{
		{[]string{"SAS_AMQP_PASSWORD=x", "SAS_AMQP_PASSWORD_FILE=" + amqp}, "SAS_AMQP_PASSWORD and SAS_AMQP_PASSWORD_FILE are both set"},
		{[]string{"SAS_AMQP_PASSWORD_FILE=" + filepath.Join(dir, "missing")}, "SAS_AMQP_PASSWORD_FILE: open"},
		{[]string{"SAS_DATABASE_PASSWORD_FILE=" + write("empty", "\n")}, "is empty"},
	} {
		_, err := secrets.PasswordFiles(c.environ)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: error %v, want %q", c.environ, err, c.want)
		}
	}
}
