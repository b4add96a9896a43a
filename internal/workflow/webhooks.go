package workflow

import (
	"fmt"
	"net/url"
	"regexp"
	"slices"
	"strings"

	"go.yaml.in/yaml/v3"

	"sas/internal/messages"
)

// Webhook is an HTTP endpoint told of the workflow's orders' ends (and,
// when its events name them, of their steps' moves): the supervisors post
// each there, signed with HMAC-SHA256 under the secret in their
// environment variable SecretEnv (the file names the variable, never the
// secret).
type Webhook struct {
	URL       string   `json:"url"`
	SecretEnv string   `json:"secret_env"`
	Events    []string `json:"events"`
	// Namespace is the namespace whose orders it is told of ("": the
	// default one; "*": every one).
	Namespace string `json:"namespace,omitempty"`
}

// The events a webhook is told of unless it says: an order's ends.
var webhookEvents = []string{"completed", "failed", "error"}

// WebhookEvents are every event a webhook may name: an order's ends, and
// a step's moves as step events tell them (step.claimed, step.awaiting,
// ...).
func WebhookEvents() []string {
	out := slices.Clone(webhookEvents)
	for _, e := range []string{EventClaimed, EventAwaiting, EventProcessed, "compensated", EventFailed, EventSkipped, EventCancelled} {
		out = append(out, "step."+e)
	}
	return out
}

// MaxWebhooks bounds a workflow's webhooks.
const MaxWebhooks = 8

var secretEnvPattern = regexp.MustCompile(`^[A-Z][A-Z0-9_]{0,63}$`)

// CheckWebhookURL reports why u cannot be a webhook's address: it must be
// an absolute http or https URL with a host, without a user or password
// (the secret signs the body; nothing else travels in the address) or a
// fragment, at most 2,048 bytes.
func CheckWebhookURL(u string) error {
	if len(u) > 2048 {
		return errWebhook("url is %d bytes, at most 2048", len(u))
	}
	parsed, err := url.Parse(u)
	switch {
	case err != nil:
		return errWebhook("url %q does not read as a URL", clipText(u))
	case parsed.Scheme != "http" && parsed.Scheme != "https":
		return errWebhook("url %q is not http:// or https://", clipText(u))
	case parsed.Host == "":
		return errWebhook("url %q has no host", clipText(u))
	case parsed.User != nil:
		return errWebhook("url must not carry a user or password; the body is signed with secret_env's secret")
	case parsed.Fragment != "" || strings.Contains(u, "#"):
		return errWebhook("url %q has a fragment; leave it out", clipText(u))
	}
	return nil
}

func errWebhook(format string, args ...any) error {
	return fmt.Errorf(format, args...)
}

func clipText(s string) string {
	if len(s) > 80 {
		return strings.ToValidUTF8(s[:80], "") + "…"
	}
	return s
}

func (p *parser) webhooks(n *yaml.Node) []Webhook {
	if n.Kind != yaml.SequenceNode {
		p.problem(n.Line, "webhooks must be a list; write \"webhooks:\" then \"  - {url: https://..., secret_env: SHOP_WEBHOOK_SECRET}\" items")
		return nil
	}
	if len(n.Content) > MaxWebhooks {
		p.problem(n.Line, "%d webhooks, at most %d", len(n.Content), MaxWebhooks)
		return nil
	}
	var out []Webhook
	seen := map[string]int{}
	for _, item := range n.Content {
		item = deref(item)
		w := Webhook{Events: slices.Clone(webhookEvents)}
		ok := p.mapping(item, "a webhook", map[string]func(*yaml.Node){
			"url": func(v *yaml.Node) {
				if err := CheckWebhookURL(v.Value); err != nil {
					p.problem(v.Line, "%v", err)
					return
				}
				w.URL = v.Value
			},
			"secret_env": func(v *yaml.Node) {
				if !secretEnvPattern.MatchString(v.Value) {
					p.problem(v.Line, "secret_env %q is not the name of an environment variable; write upper-case letters, digits and _ (the supervisor's variable holding the secret, never the secret)", clipText(v.Value))
					return
				}
				w.SecretEnv = v.Value
			},
			"namespace": func(v *yaml.Node) {
				if v.Value != "*" {
					if err := messages.CheckNamespace(v.Value); err != nil {
						p.problem(v.Line, "webhook's %v (or '*': every namespace)", err)
						return
					}
				}
				w.Namespace = v.Value
			},
			"events": func(v *yaml.Node) {
				if v.Kind != yaml.SequenceNode || len(v.Content) == 0 {
					p.problem(v.Line, "events must be a list of %s", strings.Join(WebhookEvents(), ", "))
					return
				}
				w.Events = nil
				for _, e := range v.Content {
					if !slices.Contains(WebhookEvents(), e.Value) {
						p.problem(e.Line, "event %q is not one a webhook is told of; write %s", clipText(e.Value), strings.Join(WebhookEvents(), ", "))
						continue
					}
					if !slices.Contains(w.Events, e.Value) {
						w.Events = append(w.Events, e.Value)
					}
				}
			},
		}, "url", "secret_env")
		if !ok || w.URL == "" || w.SecretEnv == "" {
			continue
		}
		if first, dup := seen[w.URL]; dup {
			p.problem(item.Line, "webhook %q is declared twice (first at line %d)", clipText(w.URL), first)
			continue
		}
		seen[w.URL] = item.Line
		out = append(out, w)
	}
	return out
}
