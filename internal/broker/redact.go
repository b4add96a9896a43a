package broker

import (
	"errors"
	"net/url"
	"strings"
)

// redact removes the password of rawURL from err's text, so that errors
// can be logged without leaking credentials.
func redact(err error, rawURL string) error {
	u, perr := url.Parse(rawURL)
	if perr != nil || u.User == nil {
		return err
	}
	pw, ok := u.User.Password()
	if !ok || pw == "" || !strings.Contains(err.Error(), pw) {
		return err
	}
	return errors.New(strings.ReplaceAll(err.Error(), pw, "xxxxx"))
}

// RedactURL returns rawURL with its password replaced, for logs.
func RedactURL(rawURL string) string {
	u, err := url.Parse(rawURL)
	if err != nil {
		return "(unparseable url)"
	}
	return u.Redacted()
}
