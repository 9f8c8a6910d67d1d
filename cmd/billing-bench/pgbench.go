package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// pgbenchDB is the scratch database of the pgbench runs, dropped and
// recreated each time.
const pgbenchDB = "billing_pgbench"

// pgbenchFor is the duration of each pgbench run.
const pgbenchFor = 10 * time.Second

// pgbenchScript is one billing transaction without the payment call: the
// statements of internal/billing and internal/dedup, in their order. The
// event id is UUIDv7-shaped, its time the transaction's now() (so it falls
// in today's processed_event partition; now() is the same in every
// statement of the transaction, so both inserts get the same id), the rest
// random; order ids are random bigints, in effect unique.
const pgbenchScript = `\set r1 random(0, 4095)
\set r2 random(0, 1152921504606846975)
\set order_id random(1, 9000000000000000000)
BEGIN;
INSERT INTO processed_event (event_id, consumer_group, processed_at)
VALUES ((lpad(to_hex((extract(epoch FROM now()) * 1000)::bigint), 12, '0') || '7' || lpad(to_hex(:r1::bigint), 3, '0') || '8' || lpad(to_hex(:r2::bigint), 15, '0'))::uuid,
        'billing-order-confirmed', now()) ON CONFLICT DO NOTHING;
INSERT INTO charge (order_id, event_id, customer_id, amount, charged_at)
VALUES (:order_id::bigint, (lpad(to_hex((extract(epoch FROM now()) * 1000)::bigint), 12, '0') || '7' || lpad(to_hex(:r1::bigint), 3, '0') || '8' || lpad(to_hex(:r2::bigint), 15, '0'))::uuid,
        1 + :order_id::bigint % 997, '123.45'::numeric, now()) ON CONFLICT DO NOTHING;
UPDATE charge SET provider_charge_id = 'ch_pgbench', charged_at = now() WHERE order_id = :order_id::bigint;
COMMIT;
`

// pgbenchResult is one pgbench run.
type pgbenchResult struct {
	Clients, Threads int
	TPS              float64 // without initial connection time
	LatencyAvg       float64 // ms
	Transactions     int
	Failed           int
}

var (
	tpsRE    = regexp.MustCompile(`tps = ([0-9.]+) \(without initial connection time\)`)
	latRE    = regexp.MustCompile(`latency average = ([0-9.]+) ms`)
	txRE     = regexp.MustCompile(`number of transactions actually processed: (\d+)`)
	failedRE = regexp.MustCompile(`number of failed transactions: (\d+)`)
)

// runPgbench migrates a scratch database next to BILLING_DATABASE_URL's,
// creates today's partitions, and runs the billing transaction with 1 and
// with 32 clients.
func runPgbench(ctx context.Context, o options, pool *pgxpool.Pool, log io.Writer, out io.Writer) ([]pgbenchResult, error) {
	bin, err := findPgbench(o.pgbench)
	if err != nil {
		return nil, err
	}
	u, err := url.Parse(o.dbURL)
	if err != nil || (u.Scheme != "postgres" && u.Scheme != "postgresql") {
		return nil, errors.New("BILLING_DATABASE_URL must be a postgres:// URL for the pgbench scratch database")
	}
	u.Path = "/" + pgbenchDB
	scratch := u.String()
	if _, err := pool.Exec(ctx, "DROP DATABASE IF EXISTS "+pgbenchDB+" WITH (FORCE)"); err != nil {
		return nil, fmt.Errorf("drop %s: %w", pgbenchDB, err)
	}
	if _, err := pool.Exec(ctx, "CREATE DATABASE "+pgbenchDB); err != nil {
		return nil, fmt.Errorf("create %s: %w", pgbenchDB, err)
	}
	defer pool.Exec(context.WithoutCancel(ctx), "DROP DATABASE IF EXISTS "+pgbenchDB+" WITH (FORCE)") //nolint:errcheck // best effort
	for _, command := range []string{"migrate", "retention"} {
		if err := runOnce(ctx, o.bin, []string{"BILLING_DATABASE_URL=" + scratch}, log, command); err != nil {
			return nil, err
		}
	}
	dir, err := os.MkdirTemp("", "billing-pgbench")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	script := filepath.Join(dir, "billing.sql")
	if err := os.WriteFile(script, []byte(pgbenchScript), 0o644); err != nil {
		return nil, err
	}
	var res []pgbenchResult
	for _, cj := range [][2]int{{1, 1}, {32, 2}} {
		fmt.Fprintf(out, "pgbench: the billing transaction, %d client(s), %v...\n", cj[0], pgbenchFor)
		cmd := exec.CommandContext(ctx, bin, "-n", "-M", "prepared", "-c", strconv.Itoa(cj[0]), "-j", strconv.Itoa(cj[1]),
			"-T", strconv.Itoa(int(pgbenchFor.Seconds())), "-f", script, scratch)
		b, err := cmd.CombinedOutput()
		fmt.Fprintf(log, "pgbench -c %d -j %d:\n%s\n", cj[0], cj[1], b)
		if err != nil {
			return nil, fmt.Errorf("pgbench -c %d: %w: %s", cj[0], err, b)
		}
		r := pgbenchResult{Clients: cj[0], Threads: cj[1]}
		r.TPS = parseFloat(tpsRE, b)
		r.LatencyAvg = parseFloat(latRE, b)
		r.Transactions = int(parseFloat(txRE, b))
		r.Failed = int(parseFloat(failedRE, b))
		if r.TPS == 0 || r.Transactions == 0 {
			return nil, fmt.Errorf("pgbench -c %d: no tps in its output: %s", cj[0], b)
		}
		res = append(res, r)
	}
	// The inserts could silently do nothing (ON CONFLICT): count the rows.
	var rows int
	conn, err := pgxpool.New(ctx, scratch)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	if err := conn.QueryRow(ctx, "SELECT (SELECT count(*) FROM processed_event) + (SELECT count(*) FROM charge WHERE provider_charge_id IS NOT NULL)").Scan(&rows); err != nil {
		return nil, err
	}
	want := 0
	for _, r := range res {
		want += 2 * r.Transactions
	}
	if rows != want {
		return nil, fmt.Errorf("pgbench wrote %d rows, want %d (2 per transaction)", rows, want)
	}
	return res, nil
}

func parseFloat(re *regexp.Regexp, b []byte) float64 {
	m := re.FindSubmatch(b)
	if m == nil {
		return 0
	}
	f, _ := strconv.ParseFloat(string(m[1]), 64)
	return f
}

// findPgbench returns bin, or the newest /usr/lib/postgresql/*/bin/pgbench,
// or pgbench from PATH.
func findPgbench(bin string) (string, error) {
	if bin != "" {
		return bin, nil
	}
	found, _ := filepath.Glob("/usr/lib/postgresql/*/bin/pgbench")
	slices.SortFunc(found, func(a, b string) int {
		va, _ := strconv.Atoi(filepath.Base(filepath.Dir(filepath.Dir(a))))
		vb, _ := strconv.Atoi(filepath.Base(filepath.Dir(filepath.Dir(b))))
		return va - vb
	})
	if len(found) > 0 {
		return found[len(found)-1], nil
	}
	return exec.LookPath("pgbench")
}
