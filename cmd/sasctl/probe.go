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
	fs := a.flags()
	rest, err := a.parse(fs, args)
	if err != nil {
		return err
	}
	if len(rest) != 1 {
		return a.usageError(fs, "give one URL")
	}
	target := rest[0]
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, target, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s answered %s", target, resp.Status)
	}
	return nil
}
