package secrets

import (
	"errors"
	"fmt"
	"os"
	"strings"
)

// PasswordFiles reads, for every variable of environ (os.Environ's form)
// named SAS_…PASSWORD…_FILE or SAS_…SECRET…_FILE, the file it names, and
// returns the variables to set: the same name without _FILE, holding the file's
// content less one final line break. A container platform mounts secrets
// as files; a password read this way is the same as one given in the
// plain variable, kept out of logs alike. Setting both forms of one
// variable, an unreadable file or an empty one is an error naming the
// variable.
func PasswordFiles(environ []string) (map[string]string, error) {
	set := map[string]bool{}
	for _, kv := range environ {
		k, _, _ := strings.Cut(kv, "=")
		set[k] = true
	}
	out := map[string]string{}
	var errs []error
	for _, kv := range environ {
		k, path, _ := strings.Cut(kv, "=")
		plain, ok := strings.CutSuffix(k, "_FILE")
		if !ok || !strings.HasPrefix(k, "SAS_") || !strings.Contains(plain, "PASSWORD") && !strings.Contains(plain, "SECRET") {
			continue
		}
		if set[plain] {
			errs = append(errs, fmt.Errorf("%s and %s are both set: give the password one way", plain, k))
			continue
		}
		if path == "" {
			continue
		}
		b, err := os.ReadFile(path)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", k, err))
			continue
		}
		pw := strings.TrimSuffix(strings.TrimSuffix(string(b), "\n"), "\r")
		if pw == "" {
			errs = append(errs, fmt.Errorf("%s: %s is empty", k, path))
			continue
		}
		out[plain] = pw
	}
	return out, errors.Join(errs...)
}

// LoadPasswordFiles sets, in this process's environment, every password
// PasswordFiles reads: called first thing in main, before the
// configuration and the log redactor read the environment.
func LoadPasswordFiles() error {
	vars, err := PasswordFiles(os.Environ())
	if err != nil {
		return err
	}
	for k, v := range vars {
		if err := os.Setenv(k, v); err != nil {
			return fmt.Errorf("%s: %w", k, err)
		}
	}
	return nil
}
