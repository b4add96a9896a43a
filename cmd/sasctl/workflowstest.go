package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"sas/internal/proctest"
	"sas/internal/workflow"
)

// workflowsTest runs a workflows file's test cases through the real state
// machine on a schema of its own, with scripted services and virtual time.
func (a *app) workflowsTest(ctx context.Context, args []string) error {
	fs := a.flags()
	runRE := fs.String("run", "", "run only the cases whose name matches this regular expression")
	junit := fs.String("junit", "", "also write the results as JUnit XML to this file")
	coverage := fs.Bool("coverage", false, "say which steps, branches, failures, compensations and wait timeouts the cases exercised")
	verbose := fs.Bool("v", false, "print every case's path and what happened, not only the failures'")
	rest, err := a.parse(fs, args)
	if err != nil {
		return err
	}
	if len(rest) == 0 {
		return a.usageError(fs, "give the workflows file, then its cases files (default: FILE's name with .cases.yaml)")
	}
	var match *regexp.Regexp
	if *runRE != "" {
		if match, err = regexp.Compile(*runRE); err != nil {
			return a.usageError(fs, "--run: %v", err)
		}
	}
	wfFile, casesFiles := rest[0], rest[1:]
	if len(casesFiles) == 0 {
		guess := strings.TrimSuffix(wfFile, filepath.Ext(wfFile)) + ".cases.yaml"
		if _, err := os.Stat(guess); err != nil {
			return fmt.Errorf("no cases file given and %s does not exist: write one (docs/YOUR-PROCESS.md, \"Test your process\") or name it", guess)
		}
		casesFiles = []string{guess}
	}
	reg, err := workflow.Load(wfFile)
	if ps, ok := workflow.AsProblems(err); ok {
		for _, p := range ps {
			fmt.Fprintln(a.stdout, p)
		}
		return fmt.Errorf("%s: %d problem(s); `sasctl workflows check` says the same", wfFile, len(ps))
	}
	if err != nil {
		return err
	}
	var suites []*proctest.Suite
	for _, f := range casesFiles {
		s, err := proctest.Load(f, wfFile)
		if err == nil {
			err = s.Check(reg)
		}
		if err != nil {
			return err
		}
		suites = append(suites, s)
	}
	env, err := proctest.Open(ctx, a.cfg.Database(4), reg)
	if err != nil {
		return err
	}
	defer env.Close()
	start := time.Now()
	var results []proctest.Result
	failed := 0
	for _, s := range suites {
		suiteStart, n, bad := time.Now(), 0, 0
		for _, c := range s.Cases {
			if match != nil && !match.MatchString(c.Name) {
				continue
			}
			t := time.Now()
			o := env.Run(ctx, c)
			if ctx.Err() != nil {
				return ctx.Err()
			}
			r := proctest.Result{Suite: s.Path, Case: c, Outcome: o, Diffs: proctest.Diff(c, o), Wall: time.Since(t)}
			proctest.Print(a.stdout, r, *verbose)
			results = append(results, r)
			n++
			if !r.Passed() {
				bad++
			}
		}
		took := time.Since(suiteStart).Seconds()
		if bad > 0 {
			fmt.Fprintf(a.stdout, "FAIL\t%s\t%d of %d cases failed (%.2fs)\n", s.Path, bad, n, took)
		} else {
			fmt.Fprintf(a.stdout, "ok\t%s\t%d cases (%.2fs)\n", s.Path, n, took)
		}
		failed += bad
	}
	if *junit != "" {
		f, err := os.Create(*junit)
		if err != nil {
			return err
		}
		err = proctest.JUnit(f, results)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return fmt.Errorf("write %s: %w", *junit, err)
		}
	}
	if *coverage {
		proctest.PrintCoverage(a.stdout, proctest.Coverage(reg, results))
	}
	switch {
	case len(results) == 0:
		return errors.New("no case ran (--run matched none)")
	case failed > 0:
		return fmt.Errorf("%d of %d cases failed (%.2fs)", failed, len(results), time.Since(start).Seconds())
	}
	return nil
}
