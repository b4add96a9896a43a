// Package api is the HTTP API (cmd/api): JSON over HTTP for applications
// and operators. Applications submit orders, read them, await their end
// (long-poll) or follow their status events (Server-Sent Events), and
// signal them; operators list and search orders, resubmit, cancel and
// re-run them with a corrected payload, one at a time or in bulk jobs
// that survive a restart. Every call carries an API token (sasctl api
// token create) whose role says what it may do; every refusal is a
// problem document (RFC 9457). The whole API is docs/api.openapi.yaml.
package api

import (
	"errors"
	"time"

	"sas/internal/archive"
	"sas/internal/oidcauth"
	"sas/internal/service"
	"sas/internal/statestore"
)

// Config is the API service's configuration (environment prefix SAS_).
type Config struct {
	service.Common
	service.WorkflowsFile
	// Addr is where the API is served.
	Addr        string `envconfig:"API_ADDR" default:":8090"`
	MetricsAddr string `envconfig:"METRICS_ADDR" default:":9107"`
	// TLSCertFile and TLSKeyFile, when both set, serve HTTPS.
	TLSCertFile string `envconfig:"API_TLS_CERT_FILE"`
	TLSKeyFile  string `envconfig:"API_TLS_KEY_FILE"`
	// Rate is how many requests a second one token may make on one
	// replica, Burst how many at once above it; past them, 429.
	Rate  float64 `envconfig:"API_RATE" default:"500"`
	Burst int     `envconfig:"API_BURST" default:"1000"`
	// TokenCache is how long a replica trusts a token it checked: a
	// revoked token is refused at the latest this long after.
	TokenCache time.Duration `envconfig:"API_TOKEN_CACHE" default:"2s"`
	// CallbacksNeedAPIToken: a step's callback (POST /steps/...) must
	// carry an API token (submitter or operator) besides the step's
	// token, which alone suffices by default.
	CallbacksNeedAPIToken bool `envconfig:"API_CALLBACKS_NEED_TOKEN" default:"false"`
	// AwaitMax bounds the timeout an await may ask for.
	AwaitMax time.Duration `envconfig:"API_AWAIT_MAX" default:"60s"`
	// BulkMax is how many orders one bulk job may act on at most.
	BulkMax int `envconfig:"API_BULK_MAX" default:"100000"`
	// BulkBatch is how many orders a replica acts on between two looks
	// at its job's lease; BulkLease how long the lease lasts unrenewed
	// (a replica that died leaves its job to another after it).
	BulkBatch int           `envconfig:"API_BULK_BATCH" default:"100"`
	BulkLease time.Duration `envconfig:"API_BULK_LEASE" default:"10s"`
	// Batch, BatchLinger and Writers gather concurrent submits into one
	// transaction, as the submitter does.
	Batch       int           `envconfig:"API_BATCH" default:"64"`
	BatchLinger time.Duration `envconfig:"API_BATCH_LINGER" default:"2ms"`
	Writers     int           `envconfig:"API_WRITERS" default:"1"`
	DBMaxConns  int32         `envconfig:"DB_MAX_CONNS" default:"10"`
	// StepTimeout, when set, replaces every step's complete-by budget
	// from the workflow definition (as the submitter's).
	StepTimeout time.Duration `envconfig:"STEP_TIMEOUT" default:"0s"`
	// Archive is where retention's archive is, to read archived orders
	// back (GET /orders/{id}/archived).
	archive.Config
	// OIDC: the API also takes the identity provider's access tokens
	// (JWTs), their roles claim mapped to submitter, viewer or operator.
	OIDC oidcauth.Config `envconfig:"OIDC"`
}

// Check reports settings that cannot work.
func (c Config) Check() error {
	if err := c.Common.Check(); err != nil {
		return err
	}
	if (c.TLSCertFile == "") != (c.TLSKeyFile == "") {
		return errors.New("SAS_API_TLS_CERT_FILE and SAS_API_TLS_KEY_FILE go together")
	}
	if c.Rate <= 0 || c.Burst < 1 {
		return errors.New("SAS_API_RATE and SAS_API_BURST must be positive")
	}
	if c.AwaitMax <= 0 || c.TokenCache < 0 || c.BulkLease < time.Second {
		return errors.New("SAS_API_AWAIT_MAX must be positive, SAS_API_TOKEN_CACHE not negative, SAS_API_BULK_LEASE at least 1s")
	}
	if err := c.OIDC.Check(false, statestore.CheckNamespace, oidcRoles...); err != nil {
		return err
	}
	if c.BulkMax < 1 || c.BulkBatch < 1 || c.Batch < 1 || c.Writers < 1 {
		return errors.New("SAS_API_BULK_MAX, SAS_API_BULK_BATCH, SAS_API_BATCH and SAS_API_WRITERS must be at least 1")
	}
	return nil
}
