package agent

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"sas/internal/contract"
)

// endpoint is the remote service of one agent kind.
type endpoint struct {
	kind string
	base string            // scheme://host[:port][/prefix], no trailing slash
	path map[string]string // per action; contract.DefaultPath otherwise
	// headers are sent on every call; their values are secrets.
	headers http.Header
	client  *http.Client
	timeout time.Duration
}

func (e *endpoint) url(action string) string {
	if p, ok := e.path[action]; ok {
		return e.base + p
	}
	return e.base + contract.DefaultPath(action)
}

// endpointFile is SAS_AGENT_ENDPOINTS_FILE.
type endpointFile struct {
	Endpoints map[string]endpointSpec `yaml:"endpoints"`
}

type endpointSpec struct {
	// URL is the service's base URL.
	URL string `yaml:"url"`
	// Paths maps an action to its path (default /v1/{action}).
	Paths map[string]string `yaml:"paths"`
	// HeadersFile and HeadersEnv hold "Name: value" lines sent with every
	// call (credentials): a file, or an environment variable's name.
	HeadersFile string `yaml:"headers_file"`
	HeadersEnv  string `yaml:"headers_env"`
	// CAFile is a PEM file of CA certificates to trust besides the
	// system's.
	CAFile string `yaml:"ca_file"`
	// Timeout bounds one call (default SAS_AGENT_CALL_TIMEOUT).
	Timeout string `yaml:"timeout"`
	// Redirects says what a redirect (a 3xx answer) does. "refuse", the
	// default: it is the call's answer, and the step fails for good
	// naming the status and the Location. "same_origin": a 307 or 308 to
	// the same scheme, host and port is followed (at most
	// maxRedirects); any other is still refused. The endpoint's headers
	// are its credentials: no redirect takes them to another origin.
	Redirects string `yaml:"redirects"`
}

// Values of endpointSpec.Redirects.
const (
	redirectsRefuse     = "refuse"
	redirectsSameOrigin = "same_origin"
)

// maxRedirects bounds the same-origin redirects one call follows.
const maxRedirects = 5

// loadEndpoints builds the endpoint of every kind served: from the
// endpoints file when it names the kind, else cfg.RemoteURL. It returns
// the header values too: secrets that no log line may show.
func loadEndpoints(cfg Config) (map[string]*endpoint, []string, error) {
	var file endpointFile
	if cfg.EndpointsFile != "" {
		raw, err := os.ReadFile(cfg.EndpointsFile)
		if err != nil {
			return nil, nil, fmt.Errorf("SAS_AGENT_ENDPOINTS_FILE: %w", err)
		}
		dec := yaml.NewDecoder(bytes.NewReader(raw))
		dec.KnownFields(true)
		if err := dec.Decode(&file); err != nil && !errors.Is(err, io.EOF) {
			return nil, nil, fmt.Errorf("%s: %v (fields: endpoints.<kind>.url, paths, headers_file, headers_env, ca_file, timeout, redirects)", cfg.EndpointsFile, err)
		}
	}
	out := map[string]*endpoint{}
	var hidden []string
	for _, kind := range cfg.Kinds {
		spec, ok := file.Endpoints[kind]
		if !ok {
			spec = endpointSpec{URL: cfg.RemoteURL}
		}
		ep, err := newEndpoint(kind, spec, cfg)
		if err != nil {
			where := "SAS_REMOTE_URL"
			if ok {
				where = cfg.EndpointsFile + ": endpoints." + kind
			}
			return nil, nil, fmt.Errorf("%s: %w", where, err)
		}
		out[kind] = ep
		for _, vs := range ep.headers {
			for _, v := range vs {
				hidden = append(hidden, credentials(v)...)
			}
		}
	}
	for kind := range file.Endpoints {
		if _, served := out[kind]; !served {
			return nil, nil, fmt.Errorf("%s: endpoints.%s: this agent does not serve kind %q (SAS_AGENT_KINDS is %s)",
				cfg.EndpointsFile, kind, kind, strings.Join(cfg.Kinds, ","))
		}
	}
	return out, hidden, nil
}

// credentials returns what a header's value holds that a service might
// echo: the value, each word of it but an authorization scheme's name
// ("Bearer"), and for Basic the decoded user:password and the password.
func credentials(v string) []string {
	out := []string{v}
	fields := strings.Fields(v)
	if len(fields) < 2 {
		return out
	}
	scheme := fields[0]
	out = append(out, fields[1:]...)
	if strings.EqualFold(scheme, "Basic") {
		if dec, err := base64.StdEncoding.DecodeString(fields[1]); err == nil {
			out = append(out, string(dec))
			if _, pw, ok := strings.Cut(string(dec), ":"); ok {
				out = append(out, pw)
			}
		}
	}
	return out
}

func newEndpoint(kind string, spec endpointSpec, cfg Config) (*endpoint, error) {
	u, err := url.Parse(spec.URL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.User != nil || u.RawQuery != "" {
		return nil, errors.New("url must be http:// or https://host[:port][/path], with no credentials or query (send credentials as headers)")
	}
	ep := &endpoint{kind: kind, base: strings.TrimRight(spec.URL, "/"), path: map[string]string{}, timeout: cfg.CallTimeout}
	for action, p := range spec.Paths {
		if !strings.HasPrefix(p, "/") {
			return nil, fmt.Errorf("paths.%s: %q must start with /", action, p)
		}
		ep.path[action] = p
	}
	if spec.Timeout != "" {
		d, err := time.ParseDuration(spec.Timeout)
		if err != nil || d <= 0 {
			return nil, fmt.Errorf("timeout %q is not a positive duration such as 5s", spec.Timeout)
		}
		ep.timeout = d
	}
	var lines []byte
	if spec.HeadersFile != "" {
		if lines, err = os.ReadFile(spec.HeadersFile); err != nil {
			return nil, fmt.Errorf("headers_file: %w", err)
		}
	}
	if spec.HeadersEnv != "" {
		v, ok := os.LookupEnv(spec.HeadersEnv)
		if !ok {
			return nil, fmt.Errorf("headers_env: %s is not set", spec.HeadersEnv)
		}
		lines = append(append(lines, '\n'), v...)
	}
	if ep.headers, err = contract.ParseHeaders(lines); err != nil {
		return nil, err
	}
	tr := &http.Transport{MaxIdleConnsPerHost: cfg.Concurrency, IdleConnTimeout: 90 * time.Second}
	if spec.CAFile != "" {
		pem, err := os.ReadFile(spec.CAFile)
		if err != nil {
			return nil, fmt.Errorf("ca_file: %w", err)
		}
		pool, err := x509.SystemCertPool()
		if err != nil {
			pool = x509.NewCertPool()
		}
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("ca_file %s holds no PEM certificate", spec.CAFile)
		}
		tr.TLSClientConfig = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	}
	var follow bool
	switch spec.Redirects {
	case "", redirectsRefuse:
	case redirectsSameOrigin:
		follow = true
	default:
		return nil, fmt.Errorf("redirects %q: write %s (the default: a redirect fails the step) or %s (follow a 307 or 308 to the same scheme, host and port)",
			spec.Redirects, redirectsRefuse, redirectsSameOrigin)
	}
	ep.client = &http.Client{Transport: tr, CheckRedirect: func(req *http.Request, via []*http.Request) error {
		if follow && len(via) <= maxRedirects && req.Response != nil &&
			(req.Response.StatusCode == http.StatusTemporaryRedirect || req.Response.StatusCode == http.StatusPermanentRedirect) &&
			origin(req.URL) == origin(via[0].URL) {
			return nil
		}
		// The redirect is the answer: classify reads it.
		return http.ErrUseLastResponse
	}}
	return ep, nil
}

// origin is a URL's scheme, host and port, the port written out.
func origin(u *url.URL) string {
	port := u.Port()
	if port == "" {
		port = map[string]string{"http": "80", "https": "443"}[strings.ToLower(u.Scheme)]
	}
	return strings.ToLower(u.Scheme) + "://" + strings.ToLower(u.Hostname()) + ":" + port
}
