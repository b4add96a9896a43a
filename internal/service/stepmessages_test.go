package service

import (
	"strings"
	"testing"

	"github.com/kelseyhightower/envconfig"
)

// TestStepMessagesAreTransientOnlyOnClassicQueues: SAS_STEP_MESSAGES is
// read, checked, and makes step messages transient on classic queues alone.
func TestStepMessagesAreTransientOnlyOnClassicQueues(t *testing.T) {
	for _, tc := range []struct {
		queueType, setting string
		transient          bool
	}{
		{"classic", "", true},
		{"classic", "transient", true},
		{"classic", "persistent", false},
		{"quorum", "", false},
		{"quorum", "transient", false},
	} {
		t.Setenv("SAS_QUEUE_TYPE", tc.queueType)
		t.Setenv("SAS_STEP_MESSAGES", tc.setting)
		var c Common
		if err := envconfig.Process("sas", &c); err != nil {
			t.Fatal(err)
		}
		if err := c.Check(); err != nil {
			t.Fatalf("%s/%q: %v", tc.queueType, tc.setting, err)
		}
		if c.TransientSteps() != tc.transient {
			t.Fatalf("%s/%q: transient %v, want %v", tc.queueType, tc.setting, c.TransientSteps(), tc.transient)
		}
	}
	c := Common{DatabaseURL: "postgres://x@127.0.0.1/sas", AMQPURL: "amqp://guest:guest@127.0.0.1:5672/", QueueType: "classic", StepMessages: "durable"}
	if err := c.Check(); err == nil || !strings.Contains(err.Error(), "SAS_STEP_MESSAGES") {
		t.Fatalf("SAS_STEP_MESSAGES=durable: %v, want it refused by name", err)
	}
}
