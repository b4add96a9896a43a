package bench

import (
	"bytes"
	"compress/flate"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"runtime"
	"runtime/debug"
	"slices"
	"time"
)

// The machines a benchmark runs on differ, and so does one machine from
// hour to hour (a shared host): the same binaries have completed 1,400
// single-step orders a second in one sitting and 740 in another. Before
// its services start, sasctl bench times a fixed piece of work on one
// core, the kind of work the services do (JSON both ways, compression,
// sorting, allocation), so that a reader can tell a slower machine from
// slower code. The work must never change, or the figures of two
// sittings stop being comparable: TestCalibrationWorkIsFixed holds its
// result.

// calibrationRuns is how many times the work is timed; the fastest
// counts (what the machine can do when nothing else runs).
const calibrationRuns = 3

// calibrate times calibrationWork (timeBest).
func calibrate() time.Duration {
	return timeBest(func() { calibrationWork() })
}

// timeBest times work on one thread with the garbage collector off (so
// no other core helps), best of calibrationRuns after one run to warm
// up.
func timeBest(work func()) time.Duration {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	defer debug.SetGCPercent(debug.SetGCPercent(-1))
	work()
	var best time.Duration
	for range calibrationRuns {
		runtime.GC()
		began := time.Now()
		work()
		if took := time.Since(began); best == 0 || took < best {
			best = took
		}
	}
	return best
}

// calibrationItem is one record of the work: the shape of a step's
// request, more or less.
type calibrationItem struct {
	ID     string            `json:"id"`
	Step   int               `json:"step"`
	Amount int64             `json:"amount"`
	Tags   []string          `json:"tags"`
	Attrs  map[string]string `json:"attrs"`
}

// calibrationWork is the fixed work: 20,000 records from a fixed
// sequence, written as JSON, read back, compressed, and 200,000 numbers
// sorted. It returns a digest of what it made, for the test that keeps
// the work as it is.
func calibrationWork() string {
	x := uint64(0x9e3779b97f4a7c15)
	next := func() uint64 { // xorshift64: the same sequence everywhere
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		return x
	}
	const letters = "abcdefghijklmnopqrstuvwxyz0123456789"
	word := func(n int) string {
		b := make([]byte, n)
		for i := range b {
			b[i] = letters[next()%uint64(len(letters))]
		}
		return string(b)
	}
	items := make([]calibrationItem, 20000)
	for i := range items {
		items[i] = calibrationItem{ID: word(16), Step: i % 7, Amount: int64(next() % 1000000),
			Tags: []string{word(5), word(8)}, Attrs: map[string]string{"k" + word(3): word(12), "k" + word(4): word(6)}}
	}
	doc, err := json.Marshal(items)
	if err != nil {
		panic(err) // plain values always encode
	}
	var back []map[string]any
	if err := json.Unmarshal(doc, &back); err != nil || len(back) != len(items) {
		panic("calibration: the JSON did not read back")
	}
	var packed bytes.Buffer
	fw, err := flate.NewWriter(&packed, flate.DefaultCompression)
	if err != nil {
		panic(err)
	}
	_, _ = fw.Write(doc)
	_ = fw.Close()
	nums := make([]uint64, 200000)
	for i := range nums {
		nums[i] = next()
	}
	slices.Sort(nums)
	h := sha256.New()
	h.Write(doc)
	for _, n := range nums[:1000] {
		h.Write([]byte{byte(n), byte(n >> 8), byte(n >> 16), byte(n >> 24)})
	}
	return hex.EncodeToString(h.Sum(nil))
}
