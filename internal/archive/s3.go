package archive

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/url"
	"path"
	"strings"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"
)

// bucket is an archive in an S3-compatible bucket: PREFIX/ID.json.
type bucket struct {
	client        *minio.Client
	name, prefix  string
	endpointShown string
}

func openS3(c Config, u *url.URL) (*bucket, error) {
	if u.Host == "" {
		return nil, fmt.Errorf("SAS_ARCHIVE %q: name the bucket, s3://BUCKET/PREFIX", c.Archive)
	}
	if c.S3Endpoint == "" {
		c.S3Endpoint = "https://s3.amazonaws.com"
	}
	ep, err := url.Parse(c.S3Endpoint)
	if err != nil || (ep.Scheme != "http" && ep.Scheme != "https") || ep.Host == "" || ep.User != nil {
		return nil, fmt.Errorf("SAS_ARCHIVE_S3_ENDPOINT: write http(s)://host[:port], without a password")
	}
	if c.S3AccessKey == "" || c.S3SecretKey == "" {
		return nil, fmt.Errorf("SAS_ARCHIVE %s needs SAS_ARCHIVE_S3_ACCESS_KEY and SAS_ARCHIVE_S3_SECRET_KEY", c.Archive)
	}
	client, err := minio.New(ep.Host, &minio.Options{
		Creds:  credentials.NewStaticV4(c.S3AccessKey, c.S3SecretKey, ""),
		Secure: ep.Scheme == "https",
		Region: c.S3Region,
	})
	if err != nil {
		return nil, fmt.Errorf("SAS_ARCHIVE %s: %w", c.Archive, err)
	}
	return &bucket{client: client, name: u.Host, prefix: strings.Trim(u.Path, "/"), endpointShown: ep.Scheme + "://" + ep.Host}, nil
}

func (b *bucket) String() string {
	return "bucket s3://" + path.Join(b.name, b.prefix) + " at " + b.endpointShown
}

func (b *bucket) key(id string) string { return path.Join(b.prefix, id+".json") }

// Put uploads the document; the service's answer is its confirmation.
func (b *bucket) Put(ctx context.Context, orderID string, doc []byte) error {
	id, err := checkID(orderID)
	if err != nil {
		return err
	}
	if _, err := b.client.PutObject(ctx, b.name, b.key(id), bytes.NewReader(doc), int64(len(doc)),
		minio.PutObjectOptions{ContentType: "application/json"}); err != nil {
		return fmt.Errorf("archive %s: %w", b, err)
	}
	return nil
}

func (b *bucket) Get(ctx context.Context, orderID string) ([]byte, error) {
	id, err := checkID(orderID)
	if err != nil {
		return nil, err
	}
	obj, err := b.client.GetObject(ctx, b.name, b.key(id), minio.GetObjectOptions{})
	if err == nil {
		var doc []byte
		doc, err = io.ReadAll(obj)
		obj.Close()
		if err == nil {
			return doc, nil
		}
	}
	if minio.ToErrorResponse(err).Code == "NoSuchKey" {
		return nil, ErrNotArchived
	}
	return nil, fmt.Errorf("archive %s: %w", b, err)
}
