package testenv_test

import (
	"os"
	"os/exec"
	"strings"
	"testing"

	"sas/internal/broker"
	"sas/internal/harness/testenv"
)

// TestUnreachableServiceFailsUnderCI runs itself again with the services
// pointed at a closed port: under CI=true the test must fail with a clear
// message; elsewhere it is skipped with the same message.
func TestUnreachableServiceFailsUnderCI(t *testing.T) {
	if svc := os.Getenv("SAS_TESTENV_HELPER"); svc != "" {
		if svc == "postgres" {
			testenv.Database(t)
		} else {
			testenv.Broker(t, broker.Topology{Prefix: "unused."})
		}
		t.Log("reached the service")
		return
	}
	t.Parallel()
	for _, tc := range []struct {
		svc, ci, want string
		fail          bool
	}{
		{"postgres", "true", "--- FAIL", true},
		{"postgres", "", "--- SKIP", false},
		{"rabbitmq", "true", "--- FAIL", true},
		{"rabbitmq", "false", "--- SKIP", false},
	} {
		cmd := exec.Command(os.Args[0], "-test.run=^TestUnreachableServiceFailsUnderCI$", "-test.v")
		cmd.Env = append(os.Environ(), "SAS_TESTENV_HELPER="+tc.svc, "CI="+tc.ci,
			"SAS_TEST_DATABASE_URL=postgres://postgres@127.0.0.1:1/none?connect_timeout=2",
			"SAS_TEST_AMQP_URL=amqp://guest:guest@127.0.0.1:1/")
		out, err := cmd.CombinedOutput()
		if (err != nil) != tc.fail || !strings.Contains(string(out), tc.want) || !strings.Contains(string(out), "is not reachable") {
			t.Errorf("%s with CI=%q: err %v, want %s with a clear message; output:\n%s", tc.svc, tc.ci, err, tc.want, out)
		}
	}
}
