package e2e

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"sas/internal/harness/testenv"
)

// TestSasctlTestsAWorkflowsFile: `sasctl workflows test` runs the loan
// example's cases (found beside the file), writes JUnit XML and the
// coverage, and exits 0; a case that expects what does not happen fails
// with what it wanted and what it got, and the command exits 1. It runs
// as a user would: the binary, a database URL and nothing else running.
func TestSasctlTestsAWorkflowsFile(t *testing.T) {
	t.Parallel()
	environ := env("SAS_DATABASE_URL=" + testenv.DatabaseURL())
	loan, err := filepath.Abs("../examples/loan/loan.yaml")
	if err != nil {
		t.Fatal(err)
	}
	junit := filepath.Join(t.TempDir(), "results.xml")
	out, errOut, code := sasctl(t, environ, "workflows", "test", loan, "--coverage", "--junit", junit)
	if code != 0 || !strings.Contains(out, "ok\t"+strings.TrimSuffix(loan, ".yaml")+".cases.yaml\t15 cases") ||
		!strings.Contains(out, "--- PASS: a loan with a hundred parties notifies each") ||
		!strings.Contains(out, "coverage of workflow loan: ") || !strings.Contains(out, "coverage of workflow kyc_check: ") {
		t.Fatalf("exit %d\n%s%s", code, out, errOut)
	}
	xml, err := os.ReadFile(junit)
	if err != nil || !strings.Contains(string(xml), `<testsuite name="`+strings.TrimSuffix(loan, ".yaml")+`.cases.yaml" tests="15" failures="0"`) {
		t.Fatalf("JUnit XML: %v\n%s", err, xml)
	}

	wrong := writeFile(t, "wrong.cases.yaml", `
cases:
  - name: a payout refused, expected to go through
    workflow: loan
    payload: {applicant: ann, amount: 100, parties: [ann]}
    services:
      sign_contract: {accept: {after: 1m}}
      disburse: {refuse: account closed}
    expect: {status: completed, took_at_most: 1d}
`)
	out, errOut, code = sasctl(t, environ, "workflows", "test", loan, wrong)
	if code != 1 || !strings.Contains(out, "--- FAIL: a payout refused, expected to go through") ||
		!strings.Contains(out, "status:\n    want completed\n    got  failed") ||
		!strings.Contains(out, "took:\n    want at most 1d\n    got  336h1m0s") ||
		!strings.Contains(out, "loan.disburse: error") || !strings.Contains(errOut, "1 of 1 cases failed") {
		t.Fatalf("exit %d\n%s%s", code, out, errOut)
	}
	_, errOut, code = sasctl(t, environ, "workflows", "test", writeFile(t, "lone.yaml", "workflows: [{name: x, steps: [{action: a, agent: k}]}]\n"))
	if code == 0 || !strings.Contains(errOut, "lone.cases.yaml does not exist") {
		t.Fatalf("no cases file: exit %d: %s", code, errOut)
	}
}
