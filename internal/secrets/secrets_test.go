package secrets_test

import (
	"encoding/base64"
	"fmt"
	"net/url"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	amqp "github.com/rabbitmq/amqp091-go"

	"sas/internal/secrets"
)

// nasty are passwords whose characters break URLs written by hand.
var nasty = []string{
	"Top/Secret", "a@b@c", "p:a:s:s", "hash#tag", "per%cent", "per%41cent", "what?now",
	"with space", "Zoë€😀", `quo"te'back\slash`, "%2F%23", "#/?@:% ", "tab\there",
}

func TestCheckURL(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		url string
		ok  bool
	}{
		{"amqp://guest:guest@127.0.0.1:5672/", true},
		{"amqps://sas:" + url.PathEscape("Top/Secret") + "@rabbit:5671/vhost", true},
		{"postgres://postgres@127.0.0.1:5432/sas?sslmode=disable", true},
		{"postgresql:///sas?host=/var/run/postgresql", true},
		{"host=db user=sas password='a b' dbname=sas", true}, // not a URL: pgx reads it
		{"amqp://sas:a@b@host/", false},                      // libraries disagree on which @ ends the user-info
		{"amqp://sas:Top/Secret@host/", false},
		{"amqp://sas:123/Secret@host/", false}, // parses, as host "sas:123" with no user
		{"amqp://sas:Top?Secret@host/", false},
		{"amqp://sas:Top#Secret@host/", false},
		{"amqp://sas:12#Secret@host/", false},
		{"amqp://sas:with space@host/", false},
		{"amqp://sas:Zoë@host/", false},
		{"amqp://sas:per%zzcent@host/", false},
		{"postgres://u:Top/Secret@db/sas", false},
	} {
		err := secrets.CheckURL("SAS_AMQP_URL", tc.url)
		if (err == nil) != tc.ok {
			t.Errorf("%s: got %v, want ok=%v", tc.url, err, tc.ok)
		}
		if err != nil {
			msg := err.Error()
			if !strings.Contains(msg, "SAS_AMQP_URL") || strings.Contains(msg, "Secret") || strings.Contains(msg, "with space") || strings.Contains(msg, "Zoë") || strings.Contains(msg, "zzcent") {
				t.Errorf("%s: error %q should name the setting and never quote the URL", tc.url, msg)
			}
		}
	}
}

// WithPassword puts any password in a URL so that every library sas uses
// reads it back unchanged.
func TestWithPasswordAnyCharacter(t *testing.T) {
	t.Parallel()
	for _, pw := range nasty {
		a, err := secrets.WithPassword("amqp://sas@127.0.0.1:5672/", pw)
		if err != nil {
			t.Fatal(err)
		}
		if err := secrets.CheckURL("SAS_AMQP_URL", a); err != nil {
			t.Errorf("%q: the URL made is refused: %v", pw, err)
		}
		uri, err := amqp.ParseURI(a)
		if err != nil || uri.Password != pw || uri.Username != "sas" || uri.Host != "127.0.0.1" {
			t.Errorf("%q: amqp reads %+v, %v", pw, uri, err)
		}
		p, err := secrets.WithPassword("postgres://sas_operator_login@127.0.0.1:5432/sas?sslmode=disable", pw)
		if err != nil {
			t.Fatal(err)
		}
		cfg, err := pgxpool.ParseConfig(p)
		if err != nil || cfg.ConnConfig.Password != pw || cfg.ConnConfig.User != "sas_operator_login" || cfg.ConnConfig.Database != "sas" {
			t.Errorf("%q: pgx reads %v", pw, err)
		}
	}
	if _, err := secrets.WithPassword("host=db user=sas", "x"); err == nil {
		t.Error("a password was added to a keyword/value string")
	}
	if got, _ := secrets.WithPassword("amqp://a:b@h/", ""); got != "amqp://a:b@h/" {
		t.Errorf("an empty password changed the URL: %s", got)
	}
}

func TestRedactorRemovesEveryForm(t *testing.T) {
	t.Parallel()
	for _, pw := range nasty {
		raw := "amqp://sas:" + pw + "@127.0.0.1:5672/"
		enc, _ := secrets.WithPassword("amqp://sas@127.0.0.1:5672/", pw)
		for name, r := range map[string]*secrets.Redactor{
			"raw url":     secrets.New(raw),
			"encoded url": secrets.New(enc),
			"password":    secrets.New(pw),
			"environ":     secrets.FromEnviron([]string{"SAS_AMQP_URL=amqp://sas@127.0.0.1:5672/", "SAS_AMQP_PASSWORD=" + pw}),
		} {
			for _, text := range []string{
				"dial " + raw + ": refused",
				"dial " + enc + ": refused",
				`parse "` + raw + `": invalid`,
				"the password is " + pw + ", or " + url.QueryEscape(pw) + ", or " + url.PathEscape(pw),
				"quoted: " + strings.Trim(strings.ReplaceAll(strings.ReplaceAll(pw, `\`, `\\`), `"`, `\"`), ""),
			} {
				if got := r.String(text); strings.Contains(got, "Secret") || strings.Contains(got, pw) {
					t.Errorf("%s redactor of %q left it in %q", name, pw, got)
				}
			}
		}
	}
}

// Scrub needs no known secret and no parseable URL.
func TestScrub(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ in, want string }{
		{`parse "amqp://sas:Top/Secret@host/": invalid port ":Top" after host`, `parse "amqp://sas:xxxxx@host/": invalid port ":Top" after host`},
		{"dial amqp://sas:p a s s@h:5672/ failed", "dial amqp://sas:xxxxx@h:5672/ failed"},
		{"x postgres://u:a#b?c@db/sas y and amqp://v:w@h/", "x postgres://u:xxxxx@db/sas y and amqp://v:xxxxx@h/"},
		{"host=db password='it\\'s a secret' user=x", "host=db password=xxxxx user=x"},
		{"host=db password=plain user=x", "host=db password=xxxxx user=x"},
		{"http://127.0.0.1:9105/v1/charge_payment: 503", "http://127.0.0.1:9105/v1/charge_payment: 503"},
		{"amqp://guest@127.0.0.1:5672/", "amqp://guest@127.0.0.1:5672/"},
		{"no url here", "no url here"},
	} {
		if got := secrets.Scrub(tc.in); got != tc.want {
			t.Errorf("Scrub(%q)\n got %q\nwant %q", tc.in, got, tc.want)
		}
	}
}

func TestShortSecretsAreNotSearchedAsText(t *testing.T) {
	t.Parallel()
	r := secrets.New("ab")
	if got := r.String("a table about abc"); got != "a table about abc" {
		t.Errorf("a two-letter secret blanked text: %q", got)
	}
	if got := r.String("amqp://u:ab@h/"); got != "amqp://u:xxxxx@h/" {
		t.Errorf("a short password in a URL stayed: %q", got)
	}
}

// FuzzParsersErrorsRedacted feeds URLs whose password holds any bytes,
// written raw or encoded, to the parsers sas hands them to (net/url, the
// AMQP and PostgreSQL drivers) and to CheckURL, and requires that what
// they say, once through the redactor built from the same setting, holds
// no part of the password. It needs no server, so it fuzzes fast; the
// service package's fuzz target runs the network paths.
func FuzzParsersErrorsRedacted(f *testing.F) {
	for _, sep := range []string{"", "/", "@", ":", "#", "%", "?", " ", "ü", "%2F", "#/?@:%", "%41", "\t", `"`, `\`, "'", "%zz", "@@", "\n", "://"} {
		f.Add(sep)
	}
	markers := []string{"Hq7Head", "Mq7Mid", "Tq7Tail"}
	f.Fuzz(func(t *testing.T, sep string) {
		pw := markers[0] + sep + markers[1] + sep + markers[2]
		enc := url.UserPassword("x", pw).String()[2:]
		for _, raw := range []string{
			"amqp://sas:" + pw + "@rabbit:5672/", "amqp://sas:" + enc + "@rabbit:5672/",
			"postgres://sas:" + pw + "@db:5432/sas", "postgres://sas:" + enc + "@db:5432/sas",
		} {
			red := secrets.New(raw)
			var said []string
			if err := secrets.CheckURL("SAS_AMQP_URL", raw); err != nil {
				said = append(said, err.Error())
			}
			if _, err := url.Parse(raw); err != nil {
				said = append(said, red.String(err.Error()))
			}
			if _, err := amqp.ParseURI(raw); err != nil {
				said = append(said, red.String(err.Error()))
			}
			if _, err := pgxpool.ParseConfig(raw); err != nil {
				said = append(said, red.String(err.Error()))
			}
			for _, s := range said {
				for _, m := range markers {
					if strings.Contains(s, m) {
						t.Fatalf("%q: %q holds a part of the password", raw, s)
					}
				}
			}
		}
	})
}

func TestScrubMasksAuthorizationCredentials(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"Authorization: Bearer eyJhbGciOiJIUzI1NiJ9.e30.x1": "Authorization: Bearer " + secrets.Mask,
		"bad token: bearer sk_live_4f2a, try again":         "bad token: bearer " + secrets.Mask + ", try again",
		"BASIC dXNlcjpwYXNzd29yZA== was refused":            "BASIC " + secrets.Mask + " was refused",
		"token ghp_16C7e42F292c6912E7710c838347Ae178B4a":    "token " + secrets.Mask,
		"a basic check failed; the token expired":           "a basic check failed; the token expired",
		"basic information":                                 "basic information",
		"unbasic Zm9vYmFyYmF6MTIz":                          "unbasic Zm9vYmFyYmF6MTIz",
	} {
		if got := secrets.Scrub(in); got != want {
			t.Errorf("Scrub(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestRedactorRewritesOnlyTheStringsOfJSON(t *testing.T) {
	t.Parallel()
	r := secrets.New("s3cret-Value-42", "k/ey\"quoted")
	for in, want := range map[string]string{
		`{"echo":"s3cret-Value-42","n":1.50e2,"list":[1,"x"]}`:   `{"echo":"` + secrets.Mask + `","n":1.50e2,"list":[1,"x"]}`,
		`{"h":{"authorization":"Bearer s3cret-Value-42"}}`:       `{"h":{"authorization":"Bearer ` + secrets.Mask + `"}}`,
		`{"k\/ey\"quoted":true, "b" : "k\/ey\"quoted and more"}`: `{"` + secrets.Mask + `":true, "b" : "` + secrets.Mask + ` and more"}`,
		`{"s3cret-Value-4\u0032":"x"}`:                           `{"` + secrets.Mask + `":"x"}`,
		`{"plain":"nothing here","esc":"a\u00e9\n"}`:             `{"plain":"nothing here","esc":"a\u00e9\n"}`,
	} {
		got := string(r.JSON([]byte(in)))
		if got != want {
			t.Errorf("JSON(%s) = %s, want %s", in, got, want)
		}
	}
}

// TestRedactorReadsThroughEncodings: a secret a service echoes is found
// however the echo is written (JSON-escaped as PHP and others write
// JSON, with \/ and \uXXXX; percent-encoded; as HTML character
// references; any mix of them, up to three levels; inside base64) and
// masked where it is written, in whatever form, and nothing else is.
func TestRedactorReadsThroughEncodings(t *testing.T) {
	t.Parallel()
	const sec = "Pa55/w0rd-Zq9"
	r := secrets.New(sec)
	u := func(s string) string { // every character as \uXXXX
		var b strings.Builder
		for _, c := range s {
			fmt.Fprintf(&b, `\u%04x`, c)
		}
		return b.String()
	}
	for _, text := range []string{
		`{"error":"bad key Pa55\/w0rd-Zq9"}`,
		`{"error":"bad key ` + u(sec) + `"}`,
		`{"error":"bad key \u0050a55\/w0rd-Zq9 again"}`,
		`{"error":"{\"h\":\"\\u0050a55\\/w0rd-Zq9\"}"}`,
		`headers: x-key=Pa55%2Fw0rd%2DZq9; other`,
		`headers: x-key=%50%61%35%35%2f%77%30%72%64%2d%5a%71%39`,
		`<p>key &#80;a55&#x2F;w0rd-Zq9</p>`,
		`echo: "\x50a55/w0rd-Zq9"`,
		`Authorization: ` + base64.StdEncoding.EncodeToString([]byte("user:"+sec)) + ` was refused`,
		`x` + base64.RawURLEncoding.EncodeToString([]byte("ab"+sec+"cd")) + `y`,
		`prefix ` + strings.Repeat("é", 3) + `Pa55\/w0rd-Zq9 and Pa55/w0rd-Zq9 twice`,
	} {
		got := r.String(text)
		for _, part := range []string{"Pa55", "w0rd", "Zq9", `\u0050a55`, "%50%61"} {
			if strings.Contains(got, part) {
				t.Errorf("%q\n  gave %q, which holds %q", text, got, part)
			}
		}
		if !strings.Contains(got, secrets.Mask) {
			t.Errorf("%q: no mask in %q", text, got)
		}
	}
	// What holds no secret is left as written, escapes and all.
	for _, text := range []string{
		`{"error":"caf\u00e9 \/ 100% & more &amp; \x41"}`, `50%2F50 &#80;ipe`, "plain text",
	} {
		if got := r.String(text); got != text {
			t.Errorf("%q changed to %q", text, got)
		}
	}
}

// TestRedactorMasksBeforeAnyCut: String sees a whole text; a secret is
// never left in part because the text was cut first (the caller cuts
// what String returns).
func TestRedactorMasksBeforeAnyCut(t *testing.T) {
	t.Parallel()
	const sec = "s3cr3t-t0ken-Zq9x"
	r := secrets.New(sec)
	body := strings.Repeat("a", 190) + sec + strings.Repeat("b", 50)
	got := r.String(body)
	if len(got) > 200 {
		got = got[:200]
	}
	for i := 4; i <= len(sec); i++ {
		if strings.Contains(got, sec[:i]) {
			t.Fatalf("the cut text holds %q of the secret: %q", sec[:i], got)
		}
	}
}
