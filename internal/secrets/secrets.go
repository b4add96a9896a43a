// Package secrets keeps credentials out of sight: it checks that a URL
// carrying a password says what its author meant, sets a password given
// apart from its URL, and removes passwords from text before it is logged
// or shown, whatever characters they hold and whether or not the text
// around them parses as a URL.
package secrets

import (
	"errors"
	"fmt"
	"net/url"
	"strings"
)

// Mask replaces a secret in redacted text.
const Mask = "xxxxx"

// urlSchemes are the schemes CheckURL checks; other settings (a
// PostgreSQL keyword/value string such as "host=db user=sas") are left to
// their library.
func urlSchemes() []string { return []string{"amqp://", "amqps://", "postgres://", "postgresql://"} }

// CheckURL reports whether raw, the value of the setting named setting,
// is a URL whose user, password and host are read as written. A password
// holding a character that ends the user-info part of a URL (/ ? #), a
// space or a non-ASCII character, or a % that starts no escape, makes the
// URL unparseable or, worse, parseable as another host with no password:
// such a URL is refused with an error that names the setting and says how
// to write it, and never quotes the URL. Values that are not URLs of the
// schemes sas uses are accepted as they are.
func CheckURL(setting, raw string) error {
	scheme := ""
	for _, s := range urlSchemes() {
		if len(raw) >= len(s) && strings.EqualFold(raw[:len(s)], s) {
			scheme = s
		}
	}
	if scheme == "" {
		return nil
	}
	fix := fmt.Sprintf("percent-encode the password's reserved characters (/ as %%2F, # as %%23, ? as %%3F, @ as %%40, %% as %%25, space as %%20) or leave it out of the URL and set it in %s", passwordSetting(setting))
	u, err := url.Parse(raw)
	if err != nil {
		var ue *url.Error
		what := "it does not parse"
		if errors.As(err, &ue) {
			what = describe(ue.Err)
		}
		return fmt.Errorf("%s is not a valid URL (%s; its credentials are not shown): %s", setting, what, fix)
	}
	if u.Fragment != "" || strings.Contains(raw, "#") {
		return fmt.Errorf("%s holds a # (a URL fragment, or a password character that must be written %%23; its credentials are not shown): %s", setting, fix)
	}
	rest := raw[len(scheme):]
	authority := rest
	if i := strings.IndexAny(rest, "/?"); i >= 0 {
		authority = rest[:i]
	}
	if strings.Count(authority, "@") > 1 {
		// Parsers disagree on which @ ends the user-info (net/url takes
		// the last, the PostgreSQL driver the first).
		return fmt.Errorf("%s holds more than one @ before its host (a password's @ must be written %%40; its credentials are not shown): %s", setting, fix)
	}
	if strings.Contains(rest, "@") && u.User == nil {
		return fmt.Errorf("%s holds an @ that does not end a user name and password (its credentials are not shown): %s", setting, fix)
	}
	if u.Host == "" && !strings.HasPrefix(rest, "/") {
		return fmt.Errorf("%s names no host: %s", setting, fix)
	}
	return nil
}

// describe says what url.Parse found wrong without quoting the input (its
// messages quote the part that failed, which may be a password).
func describe(err error) string {
	msg := err.Error()
	switch {
	case strings.Contains(msg, "invalid userinfo"):
		return "the user name or password holds a character a URL may not (a space, a non-ASCII letter)"
	case strings.Contains(msg, "invalid port"):
		return "the text after a colon before the host is not a port: a password holding / or ? ends the user-info early"
	case strings.Contains(msg, "invalid URL escape"):
		return "a % does not start a two-digit escape"
	case strings.Contains(msg, "invalid character"):
		return "the host holds a character a host may not"
	}
	return "it does not parse"
}

// passwordSetting names the setting that holds the password of a URL
// setting (SAS_AMQP_URL: SAS_AMQP_PASSWORD).
func passwordSetting(urlSetting string) string {
	if base, ok := strings.CutSuffix(urlSetting, "_URL"); ok {
		if base == "SAS_DATABASE" || base == "SAS_AMQP" {
			return base + "_PASSWORD"
		}
		return base + "_PASSWORD (where supported)"
	}
	return "a separate password setting"
}

// WithPassword returns raw with its password replaced by password,
// encoded as a URL needs it, so that any character works. An empty
// password returns raw unchanged. raw must pass CheckURL; a value that is
// not a URL is returned unchanged with an error.
func WithPassword(raw, password string) (string, error) {
	if password == "" {
		return raw, nil
	}
	u, err := url.Parse(raw)
	if err != nil || u.Scheme == "" || !strings.Contains(raw, "://") {
		return raw, errors.New("a password can only be added to a URL (scheme://user@host/...)")
	}
	user := ""
	if u.User != nil {
		user = u.User.Username()
	}
	u.User = url.UserPassword(user, password)
	return u.String(), nil
}
