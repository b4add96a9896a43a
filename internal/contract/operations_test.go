package contract_test

import (
	"os"
	"strconv"
	"strings"
	"testing"

	"sas/internal/contract"
)

// TestOperationsStatusTableMatchesClassify keeps docs/OPERATIONS.md's
// table of what the agent does with each answer in step with Classify:
// every status from 200 to 599 is covered by exactly one row ("2xx",
// "408, 409", "any other 4xx"), and the row's words say its class ("done",
// "refused for good", "not done this time").
func TestOperationsStatusTableMatchesClassify(t *testing.T) {
	t.Parallel()
	raw, err := os.ReadFile("../../docs/OPERATIONS.md")
	if err != nil {
		t.Fatal(err)
	}
	_, table, ok := strings.Cut(string(raw), "| answer | the agent |")
	if !ok {
		t.Fatal("docs/OPERATIONS.md has no table | answer | the agent |")
	}
	words := map[string]contract.Class{"done": contract.OK, "refused for good": contract.Permanent, "not done this time": contract.Transient,
		"accepted": contract.Accepted}
	class := map[int]contract.Class{}
	var others []contract.Class // "any other 4xx"
	rows := 0
	for _, line := range strings.Split(table, "\n")[2:] {
		cells := strings.Split(strings.Trim(strings.TrimSpace(line), "|"), "|")
		if len(cells) != 2 {
			break
		}
		rows++
		answer, does := strings.TrimSpace(cells[0]), strings.TrimSpace(cells[1])
		var c contract.Class
		for w, wc := range words {
			if strings.HasPrefix(does, w) {
				c = wc
			}
		}
		if c == 0 {
			t.Fatalf("row %q: %q says none of %v", answer, does, words)
		}
		if answer == "any other 4xx" {
			others = append(others, c)
			continue
		}
		if strings.HasPrefix(answer, "no answer") {
			continue // no status: the agent's own, tested in the agent
		}
		for _, code := range strings.Split(answer, ",") {
			code = strings.TrimSpace(code)
			if len(code) == 3 && strings.HasSuffix(code, "xx") {
				base := int(code[0]-'0') * 100
				for n := base; n < base+100; n++ {
					if _, dup := class[n]; dup {
						t.Fatalf("status %d is in two rows", n)
					}
					class[n] = c
				}
				continue
			}
			n, err := strconv.Atoi(code)
			if err != nil {
				t.Fatalf("row %q: %q is not a status", answer, code)
			}
			class[n] = c
		}
	}
	if rows < 5 || len(others) != 1 {
		t.Fatalf("read %d rows (%d 'any other 4xx'): the table changed shape", rows, len(others))
	}
	for n := 200; n < 600; n++ {
		c, ok := class[n]
		if !ok && n >= 400 && n < 500 {
			c, ok = others[0], true
		}
		if !ok {
			t.Errorf("status %d is in no row", n)
			continue
		}
		if got := contract.Classify(n); got != c {
			t.Errorf("status %d: the table says %s, Classify %s", n, c, got)
		}
	}
}
