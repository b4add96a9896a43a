package bench

import (
	"context"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"sas/internal/harness/localstack"
	"sas/internal/submitter"
)

// backlogReport is what a backlog run measured.
type backlogReport struct {
	Label    string `json:"label,omitempty"`
	Workflow string `json:"workflow"`
	Orders   int    `json:"orders"`
	// Seconds to publish the backlog, for the submitter to write it (from
	// the first publish), and for the schedulers and agents, started then,
	// to end every order.
	PublishSeconds float64 `json:"publish_s"`
	WrittenSeconds float64 `json:"written_s"`
	DrainSeconds   float64 `json:"drain_s"`
	DrainPerSecond float64 `json:"drained_per_s"`
	Completed      int     `json:"completed"`
	// Processes: each one's peak RSS (VmHWM) over its life, and its CPU
	// while the backlog drained.
	Processes  []processUse `json:"processes"`
	MaxRSSMiB  float64      `json:"max_rss_mib"`
	MaxRSSName string       `json:"max_rss_process"`
}

// benchBacklog queues n orders while no scheduler or agent runs (the
// submitter writes them: n orders waiting in the state store, and
// whatever it could not take yet in its queue), then starts the
// schedulers and agents and times the drain, with every process's peak
// memory: what a system that was down for a while goes through when it
// comes back.
func (a *Tool) benchBacklog(ctx context.Context, o benchOptions, n int) (*backlogReport, error) {
	rig, err := a.newBenchRig(ctx, o, true)
	if err != nil {
		return nil, err
	}
	defer rig.close()
	a, smp, store, pub, topo, serviceEnv := rig.a, rig.smp, rig.store, rig.pub, rig.topo, rig.env
	scenarioEnv, faults, err := smp.setUp(rig.dir, o.latency)
	if err != nil {
		return nil, err
	}
	serviceEnv = append(serviceEnv, scenarioEnv...)
	st, err := localstack.Start(ctx, localstack.Options{BinDir: o.binDir, Schedulers: o.schedulers, Agents: o.agents,
		Faults: faults, PortBase: o.portBase, Env: serviceEnv, DebugOffset: o.pprofOffset, HoldWorkers: true})
	if err != nil {
		return nil, err
	}
	defer st.Stop()
	fmt.Fprintf(a.stderr, "submitter and supervisor up, schedulers and agents held; logs in %s\n", st.Logs)

	rep := &backlogReport{Label: o.label, Workflow: o.wf, Orders: n}
	began := time.Now()
	gen := &generator{pub: pub, queue: topo.Queue(submitter.Input), sampler: smp}
	if err := gen.run(ctx, func(ctx context.Context, started int64) bool { return ctx.Err() == nil && started < int64(n) }); err != nil {
		return nil, err
	}
	if f := gen.failed.Load(); f > 0 {
		return nil, fmt.Errorf("%d of %d publishes failed", f, n)
	}
	rep.PublishSeconds = time.Since(began).Seconds()
	wait := func(what string, statuses ...string) error {
		for {
			c, err := store.CountOrders(ctx, statuses...)
			if err != nil {
				return err
			}
			fmt.Fprintf(a.stderr, "\r%-22s %6.0fs | %d of %d   ", what, time.Since(began).Seconds(), c, n)
			if c >= n {
				fmt.Fprintln(a.stderr)
				return nil
			}
			if err := st.Exited(); err != nil {
				return err
			}
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(500 * time.Millisecond):
			}
		}
	}
	if err := wait("written, waiting"); err != nil {
		return nil, err
	}
	rep.WrittenSeconds = time.Since(began).Seconds()

	drainFrom := time.Now()
	if err := st.StartWorkers(ctx); err != nil {
		return nil, err
	}
	cpu0 := takeCPU(ctx, st)
	if err := wait("draining, ended", "completed", "failed"); err != nil {
		return nil, err
	}
	cpu1 := takeCPU(ctx, st)
	rep.DrainSeconds = time.Since(drainFrom).Seconds()
	rep.DrainPerSecond = float64(n) / rep.DrainSeconds
	if rep.Completed, err = store.CountOrders(ctx, "completed"); err != nil {
		return nil, err
	}
	wall := cpu1.at.Sub(cpu0.at).Seconds()
	for _, p := range st.Procs {
		rss, _ := peakRSS(p.PID())
		d := cpu1.services[p.Name].sub(cpu0.services[p.Name]).cpu
		rep.Processes = append(rep.Processes, processUse{Name: p.Name, CPUSeconds: d.Seconds(), CPUPercent: 100 * d.Seconds() / wall,
			CPUMSPerOrder: float64(d.Microseconds()) / 1000 / float64(n), PeakRSSMiB: rss})
		if rss > rep.MaxRSSMiB {
			rep.MaxRSSMiB, rep.MaxRSSName = rss, p.Name
		}
	}
	return rep, nil
}

func (r *backlogReport) print(w io.Writer) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "\nBACKLOG\t%d %s orders queued with the schedulers and agents stopped, then drained\n", r.Orders, r.Workflow)
	fmt.Fprintf(tw, "published\tin %.1fs\n", r.PublishSeconds)
	fmt.Fprintf(tw, "written\tall, %.1fs after the first publish\n", r.WrittenSeconds)
	fmt.Fprintf(tw, "drained\tin %.1fs once the schedulers and agents started: %.0f orders/s, %d completed\n", r.DrainSeconds, r.DrainPerSecond, r.Completed)
	fmt.Fprintln(tw, "\nPROCESS\tpeak RSS MiB\tCPU s draining\tCPU ms per order")
	for _, p := range r.Processes {
		fmt.Fprintf(tw, "%s\t%.0f\t%.1f\t%.2f\n", p.Name, p.PeakRSSMiB, p.CPUSeconds, p.CPUMSPerOrder)
	}
	fmt.Fprintf(tw, "largest\t%.0f MiB (%s)\n", r.MaxRSSMiB, r.MaxRSSName)
	_ = tw.Flush()
}
