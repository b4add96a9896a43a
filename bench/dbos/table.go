package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"
)

// sasReport is the part of sasctl bench's JSON report the table reads.
type sasReport struct {
	CompletedPerSecond float64 `json:"completed_per_s"`
	Latency            struct {
		P50 float64 `json:"p50"`
		P99 float64 `json:"p99"`
	} `json:"latency_ms"`
	CPUMSPerOrder float64 `json:"cpu_ms_per_completed_order"`
	Processes     []struct {
		Name          string  `json:"name"`
		CPUMSPerOrder float64 `json:"cpu_ms_per_order"`
	} `json:"processes"`
	MachineBusy float64 `json:"machine_cpu_busy_percent"`
}

// table prints, from pairs NAME=SAS.json,DBOS.json, a Markdown table of
// sas beside DBOS: throughput, latency, CPU per order (and PostgreSQL's
// share), machine busy.
func table(w io.Writer, pairs []string) error {
	fmt.Fprintln(w, "| scenario | sas orders/s | DBOS orders/s | sas ÷ DBOS | sas p50 / p99 ms | DBOS p50 / p99 ms | sas CPU ms per order (PostgreSQL) | DBOS CPU ms per order (PostgreSQL) | sas ÷ DBOS CPU | machine busy sas / DBOS |")
	fmt.Fprintln(w, "|---|---|---|---|---|---|---|---|---|---|")
	for _, p := range pairs {
		name, files, ok := strings.Cut(p, "=")
		sasFile, dbosFile, ok2 := strings.Cut(files, ",")
		if !ok || !ok2 {
			return fmt.Errorf("%q: want NAME=SAS.json,DBOS.json", p)
		}
		var s sasReport
		var d report
		if err := readJSON(sasFile, &s); err != nil {
			return err
		}
		if err := readJSON(dbosFile, &d); err != nil {
			return err
		}
		sasPG := 0.0
		for _, pr := range s.Processes {
			if strings.HasPrefix(pr.Name, "postgres") {
				sasPG = pr.CPUMSPerOrder
			}
		}
		fmt.Fprintf(w, "| %s | %.0f | %.0f | %.2f | %.1f / %.1f | %.1f / %.1f | %.2f (%.2f) | %.2f (%.2f) | %.2f | %.0f %% / %.0f %% |\n",
			name, s.CompletedPerSecond, d.CompletedPerSecond, ratio(s.CompletedPerSecond, d.CompletedPerSecond),
			s.Latency.P50, s.Latency.P99, d.Latency.P50, d.Latency.P99,
			s.CPUMSPerOrder, sasPG, d.CPUMSPerOrder, d.Processes["postgres (all processes)"], ratio(s.CPUMSPerOrder, d.CPUMSPerOrder),
			s.MachineBusy, d.MachineBusy)
	}
	return nil
}

func ratio(a, b float64) float64 {
	if b == 0 {
		return 0
	}
	return a / b
}

func readJSON(path string, v any) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	if err := json.Unmarshal(b, v); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	return nil
}
