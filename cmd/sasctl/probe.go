package main

import (
	"context"
	"fmt"
	"net/http"
	"time"
)

// probe checks a health URL (a container healthcheck: the images have no
// shell and no curl). Exit 0 when it answers 200.
func (a *app) probe(ctx context.Context, args []string) error {
	if len(args) != 1 {
		fmt.Fprintln(a.stderr, "usage: sasctl probe URL")
		return errUsage
	}
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, args[0], nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s answered %s", args[0], resp.Status)
	}
	return nil
}
