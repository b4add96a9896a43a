package main

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/crypto/bcrypt"

	"sas/internal/console"
	"sas/internal/statestore"
)

// consoleUserAdd makes a console user: the password from the first line
// of standard input, its bcrypt hash written to the users file (or
// printed).
func (a *app) consoleUserAdd(_ context.Context, args []string) error {
	fs := a.flags()
	role := fs.String("role", "", "viewer (sees) or operator (also acts)")
	file := fs.String("file", "", "the users file (SAS_CONSOLE_USERS_FILE) to write; without it the line is printed")
	cost := fs.Int("cost", console.DefaultCost, "the bcrypt cost")
	var namespaces stringList
	fs.Var(&namespaces, "namespace", "a namespace the user acts in (again for several; '*': every one; default: default)")
	rest, err := a.parse(fs, args)
	if err != nil {
		return err
	}
	if len(rest) != 1 {
		return a.usageError(fs, "give the user's name")
	}
	name := rest[0]
	if err := console.CheckUserName(name); err != nil {
		return err
	}
	if err := console.CheckRole(*role); err != nil {
		return fmt.Errorf("--role: %w", err)
	}
	if err := console.CheckNamespaces(namespaces); err != nil {
		return a.usageError(fs, "--namespace: %v", err)
	}
	if *cost < bcrypt.MinCost || *cost > bcrypt.MaxCost {
		return fmt.Errorf("--cost %d: want %d to %d", *cost, bcrypt.MinCost, bcrypt.MaxCost)
	}
	fmt.Fprintf(a.stderr, "password for console user %s (one line): ", name)
	line, err := bufio.NewReader(a.stdin).ReadString('\n')
	if err != nil && line == "" {
		return fmt.Errorf("read the password from standard input: %w", err)
	}
	fmt.Fprintln(a.stderr)
	hash, err := console.HashPassword(strings.TrimRight(line, "\r\n"), *cost)
	if err != nil {
		return fmt.Errorf("password: %w", err)
	}
	if *file == "" {
		fmt.Fprintln(a.stdout, console.UserLine(name, *role, hash, namespaces))
		return nil
	}
	old, err := os.ReadFile(*file)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	if len(old) > 0 {
		if _, err := console.ParseUsers(*file, old); err != nil {
			return fmt.Errorf("the users file is invalid, not changing it:\n%w", err)
		}
	}
	data, replaced := console.AddUser(old, name, *role, hash, namespaces)
	// Written whole to a new file, then renamed: a reader sees the old
	// file or the new one, never half of it.
	tmp, err := os.CreateTemp(filepath.Dir(*file), ".users-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Chmod(0o600); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp.Name(), *file); err != nil {
		return err
	}
	verb := "added"
	if replaced {
		verb = "updated"
	}
	fmt.Fprintf(a.stdout, "console user %s (%s) %s in %s\n", name, *role, verb, *file)
	return nil
}

// devConsoleUser writes a users file for sasctl dev: the operator admin
// with a random password. It returns the file and the line telling the
// login.
func devConsoleUser() (file, login string, err error) {
	dir, err := os.MkdirTemp("", "sas-console-")
	if err != nil {
		return "", "", err
	}
	b := make([]byte, 12)
	if _, err := rand.Read(b); err != nil {
		return "", "", err
	}
	password := base64.RawURLEncoding.EncodeToString(b)
	hash, err := console.HashPassword(password, console.DefaultCost)
	if err != nil {
		return "", "", err
	}
	file = filepath.Join(dir, "users")
	if err := os.WriteFile(file, []byte(console.UserLine("admin", console.Operator, hash, []string{statestore.AllNamespaces})+"\n"), 0o600); err != nil {
		return "", "", err
	}
	return file, fmt.Sprintf("(log in as admin, password %s; users file %s)", password, file), nil
}
