package partition

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"sas/internal/harness/testenv"
	"sas/internal/messages"
)

// vector is one key's phash2 and its buckets among 3, 256 and 1000.
type vector struct {
	key     string
	phash2  uint32
	buckets [3]int
}

var vectorSizes = [3]int{3, 256, 1000}

func readVectors(t *testing.T, path string) []vector {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []vector
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) != 5 {
			t.Fatalf("%s: line %q", path, sc.Text())
		}
		var v vector
		v.key = fields[0]
		var nums [4]int
		for i := range nums {
			n, err := strconv.Atoi(fields[i+1])
			if err != nil {
				t.Fatalf("%s: line %q: %v", path, sc.Text(), err)
			}
			nums[i] = n
		}
		v.phash2 = uint32(nums[0])
		copy(v.buckets[:], nums[1:])
		out = append(out, v)
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

func checkVectors(t *testing.T, vs []vector) {
	t.Helper()
	for _, v := range vs {
		if got := phash2([]byte(v.key)); got != v.phash2 {
			t.Fatalf("phash2(%q) = %d, Erlang says %d", v.key, got, v.phash2)
		}
		for i, n := range vectorSizes {
			if got := BucketOf(v.key, n); got != v.buckets[i] {
				t.Fatalf("BucketOf(%q, %d) = %d, the exchange's jump hash says %d", v.key, n, got, v.buckets[i])
			}
		}
	}
}

// TestBucketOfIsTheExchangesBucket: the buckets of keys of every length
// (the tail of the hash's 12-byte blocks included) are those the Erlang
// runtime computes as the consistent-hash exchange does
// (testdata/vectors.escript wrote testdata/vectors.txt).
func TestBucketOfIsTheExchangesBucket(t *testing.T) {
	t.Parallel()
	vs := readVectors(t, filepath.Join("testdata", "vectors.txt"))
	if len(vs) < 300 {
		t.Fatalf("%d vectors", len(vs))
	}
	checkVectors(t, vs)
}

// TestBucketOfAgreesWithErlangNow: fresh order ids, their buckets
// computed by the Erlang runtime RabbitMQ runs on, here and now.
func TestBucketOfAgreesWithErlangNow(t *testing.T) {
	t.Parallel()
	escript, err := exec.LookPath("escript")
	if err != nil {
		testenv.Unavailable(t, "escript (Erlang, which RabbitMQ brings)", err)
	}
	keys := filepath.Join(t.TempDir(), "keys")
	var b strings.Builder
	for range 2000 {
		fmt.Fprintln(&b, messages.NewID())
	}
	if err := os.WriteFile(keys, []byte(b.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(escript, filepath.Join("testdata", "vectors.escript"), keys).Output()
	if err != nil {
		t.Fatalf("escript: %v", err)
	}
	vectors := filepath.Join(t.TempDir(), "vectors")
	if err := os.WriteFile(vectors, out, 0o600); err != nil {
		t.Fatal(err)
	}
	vs := readVectors(t, vectors)
	if len(vs) != 2000 {
		t.Fatalf("%d vectors for 2000 keys", len(vs))
	}
	checkVectors(t, vs)
}

const layoutFile = `
exchange: sas.partitions
partitions:
  - {name: p1, queue_prefix: sas.p1., database_url_env: SAS_P1_DATABASE_URL}
  - {name: p2, queue_prefix: sas.p2., database_url_env: SAS_P2_DATABASE_URL}
  - {name: p3, queue_prefix: sas.p3., database_url_env: SAS_P3_DATABASE_URL}
`

// TestLayoutSplitsBucketsEvenly: 256 buckets by default, split in
// contiguous runs of 86, 85 and 85; an order's partition is its bucket's
// owner; bucket exchanges sort as their numbers.
func TestLayoutSplitsBucketsEvenly(t *testing.T) {
	t.Parallel()
	l, err := Parse([]byte(layoutFile))
	if err != nil {
		t.Fatal(err)
	}
	if l.Buckets != DefaultBuckets {
		t.Fatalf("buckets %d, want %d", l.Buckets, DefaultBuckets)
	}
	var sizes []int
	seen := map[int]bool{}
	for i := range l.Partitions {
		owned := l.Owned(i)
		sizes = append(sizes, len(owned))
		for j, b := range owned {
			if seen[b] || (j > 0 && b != owned[j-1]+1) {
				t.Fatalf("partition %d's buckets are not one run of its own: %v", i, owned)
			}
			seen[b] = true
		}
	}
	if !slices.Equal(sizes, []int{86, 85, 85}) {
		t.Fatalf("buckets per partition %v, want [86 85 85]", sizes)
	}
	id := "b5d244ea-78c4-4e52-8b66-7bcd090ea07b" // bucket 133 of 256 (testdata)
	if b, p := l.Of(id); b != 133 || p.Name != "p2" {
		t.Fatalf("Of(%s) = %d, %s; want 133, p2", id, b, p.Name)
	}
	names := make([]string, l.Buckets)
	for b := range names {
		names[b] = l.BucketExchange(b)
	}
	if !slices.IsSorted(names) || names[7] != "sas.partitions.bucket.007" {
		t.Fatalf("bucket exchanges do not sort as their numbers: %v…", names[:10])
	}
	if p := l.Partitions[0]; p.SubmitEntrance() != "sas.p1.submit" {
		t.Fatalf("entrance %s", p.SubmitEntrance())
	}
}

// TestLayoutRefusesWhatCannotWork: every mistake is named.
func TestLayoutRefusesWhatCannotWork(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ name, file, want string }{
		{"no exchange", "partitions: [{name: p1, queue_prefix: a., database_url_env: SAS_A_URL}]", "exchange"},
		{"no partitions", "exchange: x", "0 partitions"},
		{"too many buckets", "exchange: x\nbuckets: 5000\npartitions: [{name: p1, queue_prefix: a., database_url_env: SAS_A_URL}]", "buckets 5000"},
		{"more partitions than buckets", "exchange: x\nbuckets: 1\npartitions: [{name: p1, queue_prefix: a., database_url_env: SAS_A_URL}, {name: p2, queue_prefix: b., database_url_env: SAS_B_URL}]", "each needs one"},
		{"a name twice", "exchange: x\npartitions: [{name: p1, queue_prefix: a., database_url_env: SAS_A_URL}, {name: p1, queue_prefix: b., database_url_env: SAS_B_URL}]", "named twice"},
		{"a prefix twice", "exchange: x\npartitions: [{name: p1, queue_prefix: a., database_url_env: SAS_A_URL}, {name: p2, queue_prefix: a., database_url_env: SAS_B_URL}]", "another partition's"},
		{"a bad name", "exchange: x\npartitions: [{name: P 1, queue_prefix: a., database_url_env: SAS_A_URL}]", "name \"P 1\""},
		{"a variable sas does not redact", "exchange: x\npartitions: [{name: p1, queue_prefix: a., database_url_env: P1_DB}]", "SAS_…_URL"},
		{"a URL in place of a variable", "exchange: x\npartitions: [{name: p1, queue_prefix: a., database_url_env: 'postgres://u:secret@h/db'}]", "database_url_env"},
		{"an unknown field", "exchange: x\npartitions: [{name: p1, queue_prefix: a., database_url_env: A, database_url: 'postgres://h/db'}]", "database_url"},
		{"not YAML", "{", "not a partitions layout"},
		{"every partition added", "exchange: x\npartitions: [{name: p1, queue_prefix: a., database_url_env: SAS_A_URL, added: true}]", "every partition is added"},
		{"an added partition first", "exchange: x\npartitions: [{name: p1, queue_prefix: a., database_url_env: SAS_A_URL, added: true}, {name: p2, queue_prefix: b., database_url_env: SAS_B_URL}]", "every partition is added"},
		{"an added partition between", "exchange: x\npartitions: [{name: p1, queue_prefix: a., database_url_env: SAS_A_URL}, {name: p2, queue_prefix: b., database_url_env: SAS_B_URL, added: true}, {name: p3, queue_prefix: c., database_url_env: SAS_C_URL}]", "added partitions go last"},
	} {
		_, err := Parse([]byte(tc.file))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want an error saying %q", tc.name, err, tc.want)
		}
		if err != nil && strings.Contains(err.Error(), "secret") {
			t.Errorf("%s: the error shows a password: %v", tc.name, err)
		}
	}
}

// A partition added to a layout owns no bucket, and the others keep
// theirs; a layout following moved buckets gives each its owner now, in
// every copy of it, while schedules stay where the file puts them.
func TestAddedPartitionsAndMovedBuckets(t *testing.T) {
	t.Parallel()
	two, err := Parse([]byte("exchange: x\nbuckets: 16\npartitions: [{name: p1, queue_prefix: a., database_url_env: SAS_A_URL}, {name: p2, queue_prefix: b., database_url_env: SAS_B_URL}]"))
	if err != nil {
		t.Fatal(err)
	}
	l, err := Parse([]byte("exchange: x\nbuckets: 16\npartitions: [{name: p1, queue_prefix: a., database_url_env: SAS_A_URL}, " +
		"{name: p2, queue_prefix: b., database_url_env: SAS_B_URL}, {name: p3, queue_prefix: c., database_url_env: SAS_C_URL, added: true}]"))
	if err != nil {
		t.Fatal(err)
	}
	for b := range l.Buckets {
		if l.Owner(b) != two.Owner(b) || l.Moved(b) {
			t.Fatalf("bucket %d: owner %d with p3 added, %d without", b, l.Owner(b), two.Owner(b))
		}
	}
	if owned := l.Owned(2); len(owned) != 0 {
		t.Fatalf("the added partition owns %v", owned)
	}
	copied := l
	if err := l.Follow(map[int]string{3: "p3", 12: "p1"}); err != nil {
		t.Fatal(err)
	}
	if copied.Owner(3) != 2 || copied.Owner(12) != 0 || !copied.Moved(3) || copied.Owner(4) != 0 || copied.FirstOwner(3) != 0 {
		t.Fatalf("after the moves: bucket 3's owner %d, 12's %d, 4's %d", copied.Owner(3), copied.Owner(12), copied.Owner(4))
	}
	if got := l.Owned(2); !slices.Equal(got, []int{3}) {
		t.Fatalf("p3 owns %v, want [3]", got)
	}
	for i := range 50 {
		name := fmt.Sprint("schedule-", i)
		if l.ScheduleOwner(name) != two.ScheduleOwner(name) {
			t.Fatalf("schedule %s moved with its bucket", name)
		}
	}
	if err := l.Follow(map[int]string{5: "p9"}); err == nil || !strings.Contains(err.Error(), "p9") {
		t.Fatalf("a move to a partition not in the layout: %v", err)
	}
	if l.Owner(3) != 2 || l.Moved(5) {
		t.Fatal("a refused follow changed the layout")
	}
	if err := l.Follow(nil); err != nil || l.Moved(3) || l.Owner(3) != 0 {
		t.Fatalf("following no moves: %v, bucket 3's owner %d", err, l.Owner(3))
	}
}
