package archive_test

import (
	"context"
	"errors"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/johannesboyne/gofakes3"
	"github.com/johannesboyne/gofakes3/backend/s3mem"

	"sas/internal/archive"
	"sas/internal/messages"
)

// roundTrip puts a document and reads it back; an order it does not hold
// is ErrNotArchived; what is not an order id names no file or key.
func roundTrip(t *testing.T, a archive.Archive) {
	t.Helper()
	ctx := context.Background()
	id := messages.NewID()
	doc := []byte(`{"schema_version":1,"order":{"order_id":"` + id + `"}}`)
	if err := a.Put(ctx, id, doc); err != nil {
		t.Fatal(err)
	}
	if err := a.Put(ctx, id, doc); err != nil {
		t.Fatalf("putting the same document again: %v", err)
	}
	got, err := a.Get(ctx, strings.ToUpper(id))
	if err != nil || string(got) != string(doc) {
		t.Fatalf("get: %q %v", got, err)
	}
	if _, err := a.Get(ctx, messages.NewID()); !errors.Is(err, archive.ErrNotArchived) {
		t.Fatalf("an order never archived: %v, want ErrNotArchived", err)
	}
	for _, bad := range []string{"../../etc/passwd", "", id + "/x", "ab"} {
		if err := a.Put(ctx, bad, doc); err == nil {
			t.Fatalf("put under %q was taken", bad)
		}
		if _, err := a.Get(ctx, bad); err == nil || errors.Is(err, archive.ErrNotArchived) {
			t.Fatalf("get of %q: %v, want refused", bad, err)
		}
	}
}

func TestADirectoryKeepsDocuments(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	a, err := archive.Open(archive.Config{Archive: "file://" + root})
	if err != nil {
		t.Fatal(err)
	}
	roundTrip(t, a)
	// No temporary file is left beside the documents.
	var files []string
	_ = filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			files = append(files, filepath.Base(p))
		}
		return nil
	})
	if len(files) != 1 || !strings.HasSuffix(files[0], ".json") {
		t.Fatalf("files in the archive: %v, want one document", files)
	}
	// A directory that is gone refuses a put: nothing is confirmed.
	gone, err := archive.Open(archive.Config{Archive: filepath.Join(root, "missing")})
	if err != nil {
		t.Fatal(err)
	}
	if err := gone.Put(context.Background(), messages.NewID(), []byte(`{}`)); err == nil {
		t.Fatal("a put into a directory that is not there was confirmed")
	}
}

func TestOpenSaysWhatIsWrong(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		c    archive.Config
		want string
	}{
		{archive.Config{Archive: "relative/dir"}, "write an absolute path"},
		{archive.Config{Archive: "file://host/x"}, "file:///absolute/path"},
		{archive.Config{Archive: "s3://bucket/p"}, "SAS_ARCHIVE_S3_ACCESS_KEY"},
		{archive.Config{Archive: "s3://bucket/p", S3Endpoint: "http://u:secret-pw@127.0.0.1:1", S3AccessKey: "a", S3SecretKey: "b"}, "without a password"},
		{archive.Config{Archive: "ftp://x"}, "s3://bucket/prefix"},
	} {
		_, err := archive.Open(tc.c)
		if err == nil || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "secret-pw") {
			t.Fatalf("open %+v: %v, want an error saying %q and no secret", tc.c.Archive, err, tc.want)
		}
	}
	if a, err := archive.Open(archive.Config{}); a != nil || err != nil {
		t.Fatalf("no archive: %v %v", a, err)
	}
}

// s3Server serves an S3-compatible service on loopback with a bucket.
func s3Server(t *testing.T, bucket string) (addr string, stop func()) {
	t.Helper()
	backend := s3mem.New()
	if err := backend.CreateBucket(bucket); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: gofakes3.New(backend).Server()}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.Serve(ln)
	}()
	stop = func() {
		_ = srv.Close()
		<-done
	}
	t.Cleanup(stop)
	return ln.Addr().String(), stop
}

func TestABucketKeepsDocuments(t *testing.T) {
	t.Parallel()
	addr, stop := s3Server(t, "archive")
	c := archive.Config{Archive: "s3://archive/sas/orders", S3Endpoint: "http://" + addr, S3Region: "us-east-1",
		S3AccessKey: "test-access", S3SecretKey: "test-secret-key"}
	a, err := archive.Open(c)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(a.String(), "test-secret-key") || !strings.Contains(a.String(), "s3://archive/sas/orders") {
		t.Fatalf("the archive says %q", a)
	}
	roundTrip(t, a)
	stop()
	err = a.Put(context.Background(), messages.NewID(), []byte(`{}`))
	if err == nil {
		t.Fatal("a put to a stopped service was confirmed")
	}
	if strings.Contains(err.Error(), "test-secret-key") {
		t.Fatalf("the error shows the secret: %v", err)
	}
}
