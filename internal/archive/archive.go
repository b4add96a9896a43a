// Package archive keeps ended orders' whole records before retention
// deletes them: one JSON document per order (statestore.ArchivedOrder),
// in a directory or an S3-compatible bucket. Retention deletes an order
// only once the archive confirmed it keeps the document (Retain); an
// archive that is down holds retention back and loses nothing.
package archive

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"

	"sas/internal/messages"
)

// Config says where the archive is. It is read from the environment by
// every service that writes or reads it (the supervisor, the API,
// sasctl).
type Config struct {
	// Archive is where ended orders are archived before retention deletes
	// them: a directory (an absolute path, or file:///path) or an
	// S3-compatible bucket (s3://BUCKET/PREFIX); "" for none.
	Archive string `envconfig:"ARCHIVE"`
	// S3Endpoint is the S3 service's address (https://s3.amazonaws.com
	// by default; http://host:port for one of your own).
	S3Endpoint string `envconfig:"ARCHIVE_S3_ENDPOINT" default:"https://s3.amazonaws.com"`
	S3Region   string `envconfig:"ARCHIVE_S3_REGION" default:"us-east-1"`
	// S3AccessKey and S3SecretKey sign the requests (never logged).
	S3AccessKey string `envconfig:"ARCHIVE_S3_ACCESS_KEY"`
	S3SecretKey string `envconfig:"ARCHIVE_S3_SECRET_KEY"`
}

// Archive keeps documents by order id.
type Archive interface {
	// Put keeps doc as the order's document; it returns once the
	// archive holds it durably (a directory: written, synced and renamed
	// into place; S3: the service's answer to the upload).
	Put(ctx context.Context, orderID string, doc []byte) error
	// Get reads the order's document; ErrNotArchived when it has none.
	Get(ctx context.Context, orderID string) ([]byte, error)
	// String says where it is, without a secret.
	String() string
}

// ErrNotArchived is Get's answer for an order the archive does not hold.
var ErrNotArchived = errors.New("not archived")

// Open opens the archive c names; nil (and no error) when it names none.
func Open(c Config) (Archive, error) {
	if c.Archive == "" {
		return nil, nil
	}
	if strings.HasPrefix(c.Archive, "/") {
		return openDir(c.Archive)
	}
	u, err := url.Parse(c.Archive)
	if err != nil {
		return nil, fmt.Errorf("SAS_ARCHIVE %q is not a directory or a URL: %v", c.Archive, err)
	}
	switch u.Scheme {
	case "file":
		if u.Host != "" || u.Path == "" {
			return nil, fmt.Errorf("SAS_ARCHIVE %q: write file:///absolute/path", c.Archive)
		}
		return openDir(u.Path)
	case "s3":
		return openS3(c, u)
	}
	return nil, fmt.Errorf("SAS_ARCHIVE %q: write an absolute path, file:///path or s3://bucket/prefix", c.Archive)
}

// checkID refuses what is not an order id: the id names a file or a key.
func checkID(orderID string) (string, error) {
	id, ok := messages.CanonicalID(orderID)
	if !ok {
		return "", fmt.Errorf("%q is not an order id", orderID)
	}
	return id, nil
}
