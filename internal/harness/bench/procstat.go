package bench

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// Readings from Linux's /proc for sasctl bench.

// clockTicks is USER_HZ, the unit of /proc's CPU times: 100 on every
// Linux architecture Go runs on.
const clockTicks = 100

// processCPU is the CPU time (user + system) pid has used.
func processCPU(pid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// The command name, in parentheses, may hold spaces: count fields
	// after its closing parenthesis. There, utime and stime are the 12th
	// and 13th (fields 14 and 15 of proc(5)).
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, fmt.Errorf("/proc/%d/stat: unexpected format", pid)
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 13 {
		return 0, fmt.Errorf("/proc/%d/stat: unexpected format", pid)
	}
	utime, err1 := strconv.ParseInt(f[11], 10, 64)
	stime, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("/proc/%d/stat: unexpected format", pid)
	}
	return time.Duration(utime+stime) * time.Second / clockTicks, nil
}

// statusField reads one "Name: value" line of /proc/PID/status.
func statusField(pid int, name string) (string, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return "", err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), name+":"); ok {
			return strings.TrimSpace(v), nil
		}
	}
	return "", fmt.Errorf("/proc/%d/status has no %s", pid, name)
}

// peakRSS is the process's peak resident set (VmHWM) in MiB.
func peakRSS(pid int) (float64, error) {
	v, err := statusField(pid, "VmHWM")
	if err != nil {
		return 0, err
	}
	kb, err := strconv.ParseFloat(strings.TrimSuffix(v, " kB"), 64)
	if err != nil {
		return 0, err
	}
	return kb / 1024, nil
}

// serverPIDs finds the PostgreSQL and RabbitMQ server processes on this
// machine by their command names.
func serverPIDs() map[string][]int {
	out := map[string][]int{}
	dirs, _ := filepath.Glob("/proc/[0-9]*")
	for _, d := range dirs {
		pid, err := strconv.Atoi(filepath.Base(d))
		if err != nil {
			continue
		}
		comm, err := os.ReadFile(filepath.Join(d, "comm"))
		if err != nil {
			continue
		}
		switch strings.TrimSpace(string(comm)) {
		case "postgres":
			out["postgres"] = append(out["postgres"], pid)
		case "beam.smp", "erl_child_setup", "epmd":
			out["rabbitmq"] = append(out["rabbitmq"], pid)
		}
	}
	return out
}

// machineCPU is the first line of /proc/stat: busy, stolen (taken by the
// hypervisor for other guests) and total jiffies.
type machineCPU struct{ busy, steal, total int64 }

func readMachineCPU() (machineCPU, error) {
	f, err := os.Open("/proc/stat")
	if err != nil {
		return machineCPU{}, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	if !sc.Scan() {
		return machineCPU{}, fmt.Errorf("/proc/stat is empty")
	}
	fields := strings.Fields(sc.Text())
	if len(fields) < 6 || fields[0] != "cpu" {
		return machineCPU{}, fmt.Errorf("/proc/stat: unexpected format")
	}
	var m machineCPU
	for i, f := range fields[1:] {
		v, err := strconv.ParseInt(f, 10, 64)
		if err != nil {
			return machineCPU{}, fmt.Errorf("/proc/stat: %w", err)
		}
		if i >= 8 { // guest time is already in user time
			break
		}
		m.total += v
		switch i {
		case 3, 4: // idle, iowait
		case 7:
			m.steal += v
		default:
			m.busy += v
		}
	}
	return m, nil
}

// busySince is the percentage of all CPUs' time spent busy since then,
// and the percentage stolen by the hypervisor.
func (m machineCPU) busySince(then machineCPU) (busy, steal float64) {
	if m.total <= then.total {
		return 0, 0
	}
	d := float64(m.total - then.total)
	return 100 * float64(m.busy-then.busy) / d, 100 * float64(m.steal-then.steal) / d
}

// memTotal is the machine's memory as /proc/meminfo says.
func memTotal() string {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return ""
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "MemTotal:"); ok {
			if kb, err := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 64); err == nil {
				return fmt.Sprintf("%.1f GiB", kb/1024/1024)
			}
		}
	}
	return ""
}

// cpuModel is the machine's CPU as /proc/cpuinfo names it, "" where it
// does not.
func cpuModel() string {
	b, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return ""
	}
	for _, line := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

// contextSwitches is how often pid's threads have left the CPU, voluntarily
// (to wait: a sleep, a lock, a read with nothing to read) or not: with few
// threads preempted, how often the process woke. Threads that have ended
// no longer count.
func contextSwitches(pid int) (int64, error) {
	tasks, err := filepath.Glob(fmt.Sprintf("/proc/%d/task/[0-9]*", pid))
	if err != nil || len(tasks) == 0 {
		return 0, fmt.Errorf("/proc/%d/task: no threads", pid)
	}
	var n int64
	for _, t := range tasks {
		b, err := os.ReadFile(filepath.Join(t, "status"))
		if err != nil {
			continue // the thread ended meanwhile
		}
		for _, line := range strings.Split(string(b), "\n") {
			for _, name := range []string{"voluntary_ctxt_switches:", "nonvoluntary_ctxt_switches:"} {
				if v, ok := strings.CutPrefix(line, name); ok {
					c, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
					if err != nil {
						return 0, fmt.Errorf("%s/status: %w", t, err)
					}
					n += c
				}
			}
		}
	}
	return n, nil
}
