package main

import (
	"flag"
	"fmt"
	"io"
	"runtime/debug"
	"slices"
	"strings"
)

// doc describes one command for its help.
type doc struct {
	path    string // "orders list"
	args    string // what follows the path on the command line
	summary string // one line, for the list of commands
	detail  string // what it does, in full
	env     []string
}

// docs lists every command sasctl has, in the order its help shows them.
func docs() []doc {
	dbEnv := []string{"SAS_DATABASE_URL", "SAS_DATABASE_PASSWORD", "SAS_DB_LOCK_TIMEOUT"}
	brokerEnv := []string{"SAS_AMQP_URL", "SAS_AMQP_PASSWORD", "SAS_AMQP_CA_FILE", "SAS_QUEUE_PREFIX", "SAS_DELIVERY_LIMIT"}
	both := append(slices.Clone(dbEnv), brokerEnv...)
	workflowsEnv := append(slices.Clone(brokerEnv), "SAS_WORKFLOWS_FILE")
	return []doc{
		{"migrate", "", "apply the state store's migrations",
			"Applies the state store's migrations not yet applied to the schema SAS_DATABASE_URL points at (its search_path), each in its own transaction, and creates the service roles. Safe to run twice, or twice at once. Run it as the tables' owner.", dbEnv},
		{"submit", "--file FILE | --count N [flags]", "publish orders to the submit queue",
			"Publishes one order from a JSON file (\"-\" for stdin), or N generated sample orders (their payload from --payload, a JSON object inline or @FILE, else random demo orders), to the submit queue, persistent, mandatory and confirmed by the broker; a publish not confirmed is repeated (a repeat is the same order). An order naming a workflow the workflows file (--workflows, else SAS_WORKFLOWS_FILE, else the built-in one) does not have, or whose payload breaks its schema, is refused before anything is published. With --partitions (or SAS_PARTITIONS_FILE) the orders go to the partitions' routing exchange with their id as routing key, each to its partition (sasctl partitions).", append(slices.Clone(workflowsEnv), "SAS_PARTITIONS_FILE")},
		{"orders list", "[--where NAME=VALUE]... [--namespace NS] [flags]", "list orders, newest first",
			"Lists orders, newest first, with their status, workflow, priority and times; --namespace keeps one namespace's (sasctl namespaces list); --workflow takes any name (orders may run workflows of another file than this one's). --where selects by a search attribute a workflow declares (search_attributes), typed as the workflows file (--workflows, else SAS_WORKFLOWS_FILE, else the built-in one) says: customer=42, amount>=100, express=true; several must all hold.", append(slices.Clone(dbEnv), "SAS_WORKFLOWS_FILE")},
		{"orders show", "ID [--json] [--namespace NS]", "an order with its steps and full history",
			"Shows an order: its payload, each step's state, attempt, failures, lock, deadline and last error, and its full history (who moved what, when and why). Fits 100 columns; --json prints everything as JSON.", dbEnv},
		{"orders resubmit", "ID [--step N] [--as NAME] [--namespace NS]", "put an order's failed step back to pending, or run a step again",
			"Puts the step in error of an order held in error (or step N, if it is in error) back to pending with failure_count 0, and the order back to processing; in a graph every step in error goes back. With --step N an action that ended (processed or skipped), N runs again and so does every action that depends on it (in a graph the steps that need it, directly or not; in a list the steps after it), each that had been processed with a new idempotency key; the instances of a for_each step among them are dropped, so its list is read again. The history records the database login that did it and, apart, the name given with --as (default: $USER).", dbEnv},
		{"orders signal", "ID NAME | --workflow W --where K=V [--all] NAME [--payload JSON|@FILE] [--id ID] [--as NAME] [--namespace NS]", "send a signal for an order's wait step",
			"Sends a signal NAME for the order through the signals queue, as an application does: it ends the order's step that waits for it (wait: {signal: NAME}), its payload (any JSON value) the step's result; one sent before that wait began is kept until it begins. The same --id twice is applied once. A signal the order would refuse (unknown or ended order, no step waiting for NAME, or every such step ended) is not sent, and why is said; then it waits up to --wait (10s) to say what became of it. The history records --as (default: $USER) as its sender. With --workflow and --where instead of an id, the signal names its order by business key: the running order of that workflow whose search attributes have those values; none, or several without --all, is refused with why, and each order reached gets it under the id ID:ORDER_ID.", dbEnv},
		{"steps complete", "TOKEN [--result JSON|@FILE] [--id ID] [--as NAME]", "complete a step its service holds (202), by its token",
			"Completes the step a step token names (the Sas-Step-Token of the call its service answered 202 Accepted), its result the JSON object --result gives, as the service would by calling back; fenced as any callback: a token of an attempt that no longer runs (stale_token), one this deployment did not make (invalid_token) or the same callback again (duplicate) changes nothing and says so. The history records --as (default: $USER).", dbEnv},
		{"steps fail", "TOKEN --error TEXT [--id ID] [--as NAME]", "fail a step its service holds (202), by its token",
			"Fails the step a step token names, with the reason --error gives, as its service would by calling back: the step's failure policy applies (retries, then compensation or an operator). Fenced and refused as steps complete is.", dbEnv},
		{"steps heartbeat", "TOKEN [--as NAME]", "hold a step its service holds (202) open longer",
			"Holds the step a step token names open, as its service's heartbeat does: its complete_by moves out by the step's timeout, never past its claim plus max_duration. Fenced and refused as steps complete is.", dbEnv},
		{"webhooks list", "[--dead | --state S] [--order ID] [--limit N] [--json]", "list webhook deliveries and what came of them",
			"Lists the deliveries of orders' ends to the webhooks their workflows name, newest first: the order, the end (completed, failed, error), the address, the state (pending, sent, or dead after SAS_SUPERVISOR_WEBHOOK_ATTEMPTS tries), the tries and the last error. The secret is never stored: only the name of the supervisor's environment variable holding it.", dbEnv},
		{"webhooks replay", "ID [--as NAME]", "try a dead webhook delivery again",
			"Makes a dead delivery due again, its tries counted from 0: the supervisors post it within SAS_SUPERVISOR_WEBHOOK_POLL, with the same id (Sas-Webhook-Id), so a receiver that took it before takes it once. The operator's actions record --as (default: $USER).", dbEnv},
		{"orders cancel", "ID [--as NAME] [--namespace NS]", "end an order: undo what was done, then failed",
			"Ends an order that has not ended (received, processing or held in error): its unfinished actions are cancelled and those that were attempted are compensated, last first; it ends failed. Recorded as resubmit is.", dbEnv},
		{"orders migrate", "--workflow W --to VERSION [--workflows FILE] [--id ID]... [--where K=V]... [--apply] [--as NAME] [--json] [--namespace NS]", "move running orders to another version of their workflow",
			"Moves the running orders (received, processing) of workflow W to its version in the workflows file (a fixed definition): first a dry run that says, per order, whether it can move and why not; with --apply each that can is moved in one transaction (its history records it, it is pinned to the new version). An order can move when every action it began is in the new version (by id, else action) with the same action and agent at the same position, and no compensation or for_each instance has begun; actions not begun that the new version lacks are dropped, its other actions come waiting. Orders that cannot move are left as they are and listed.", dbEnv},
		{"orders pause", "ID [--reason TEXT] [--as NAME] [--namespace NS]", "pause an order: nothing new of it is claimed",
			"Pauses an order that runs (received, processing or compensating): its steps in flight end normally and their replies are applied, but nothing of it is claimed, its delays, waits' timeouts and deadline do not fire and the supervisor does not expire its steps until it is resumed; its deadline then moves on by the time it was paused. Recorded with the operator.", dbEnv},
		{"orders resume", "ID [--as NAME] [--namespace NS]", "resume a paused order",
			"Resumes a paused order: its pending steps are claimed at once and its timers that fell due meanwhile fire. Recorded with the operator.", dbEnv},
		{"pauses list", "[--limit N] [--json]", "what is paused: workflows, agent kinds, orders",
			"Lists the paused workflows and agent kinds, then the paused orders (on their own, or with their workflow), the oldest first, with who paused them, when and why.", dbEnv},
		{"orders purge", "--older-than D [--status S] [--batch N] [--yes]", "delete ended orders older than D",
			"Deletes orders that ended (completed or failed; --status narrows it) more than D ago, with their steps, history and alerts, N at a time, after saying how many and asking (--yes for scripts), and says how many rows went. Orders held in error and orders in flight are never deleted. The supervisor does the same every SAS_RETENTION_INTERVAL for orders older than SAS_RETENTION.", dbEnv},
		{"alerts list", "[--open] [--since D] [--order ID] [--limit N] [--json] [--namespace NS]", "operator alerts, newest first",
			"Lists operator alerts (a step that reached its failure threshold or failed for good; a compensation that failed) from the state store, newest first, with who acknowledged them and when; --namespace keeps the alerts of that namespace's orders. Reading them changes nothing: every operator sees every alert.", dbEnv},
		{"alerts ack", "ID... [--as NAME] [--namespace NS]", "acknowledge alerts",
			"Acknowledges open alerts as the database login running sasctl (recorded by the database, it cannot be chosen) with the name given with --as (default: $USER) as a label.", dbEnv},
		{"api token create", "--name NAME --role submitter|viewer|operator [--namespace NS]... [--as NAME]", "make an API token, shown once",
			"Makes a token for the HTTP API (cmd/api) and prints it on standard output, the only time it is shown; the store keeps the SHA-256 of its secret. A submitter token submits, and reads, awaits and signals the orders it submitted; a viewer reads every order and bulk job; an operator also resubmits, cancels, re-runs and acts in bulk. It acts in the namespaces named (default: default; '*': every one): the orders and bulk jobs of any other are \"not found\" to it, and the actions on the whole deployment (a workflow's or kind's pause, migrations) need a token of every namespace. Names are never reused; the history names the token (api:NAME) on what it did.", dbEnv},
		{"namespaces add", "NAME... [--as NAME]", "add namespaces (tenants)",
			"Adds namespaces: the API's tokens granted one (api token create --namespace) submit to it (the Sas-Namespace header) and see only its orders. Every order and token made before namespaces is in default.", dbEnv},
		{"namespaces list", "[--json]", "the namespaces and their quotas",
			"Lists the namespaces, who added them and when, their quotas and who set them.", dbEnv},
		{"namespaces quota", "NAME [--in-flight N] [--rate R] [--burst N] [--payload-bytes N] [--as NAME] | NAME --none", "set a namespace's quotas",
			"Sets the quotas of namespace NAME, each left out being none: the orders it has in flight (not ended), the orders it submits a second (--rate 50/s, 600/m; a bucket of --burst, by default the rate rounded up) and the bytes of one order's payload. Every API replica holds the namespace to them within 5 s: a submit past one is refused, 429 with Retry-After (413 for a payload), and writes nothing; a repeat of an order already written takes nothing of them. The default namespace has none.", dbEnv},
		{"api token list", "[--json]", "the API tokens: role, maker, last use, revocation",
			"Lists every API token, revoked ones too, with its role, who made it and when, when it was last used (to the minute) and who revoked it. Never a secret.", dbEnv},
		{"api token revoke", "NAME [--as NAME]", "revoke an API token",
			"Revokes the token NAME: the API refuses it (401) within SAS_API_TOKEN_CACHE (2s). The token stays listed, for the history that names it.", dbEnv},
		{"limits list", "[--namespace NS] [--json]", "each agent kind's limits and their use",
			"Lists the agent kinds with limits (the workflows file's limits: section, or an operator's): max_in_flight, rate, burst and min_rate in force, who set them, the steps processing, the due steps waiting for the limit and the longest wait, how many have waited longer than their own timeout, and whether a service's 429 holds the rate lowered; then the namespaces' own limits on kinds, with their steps processing and waiting. --namespace lists that namespace's own alone.", dbEnv},
		{"limits set", "KIND [--namespace NS] [--rate R] [--burst N] [--max-in-flight N] [--min-rate R] [--as NAME]", "change an agent kind's limits now",
			"Changes an agent kind's limits without a restart: every scheduler's next claim of the kind obeys them, across every replica (R: 20/s, 600/m, 3600/h; none removes a limit). What is not given stays as it is now. They stand until sasctl limits reset, a restart included; recorded with the database login running sasctl and the name given with --as. With --namespace, the namespace's own limits on the kind (rate, burst, max-in-flight): its steps of the kind are held by them within the kind's, and the other namespaces' are claimed beside them; the default namespace has none of its own.", dbEnv},
		{"limits reset", "KIND [--namespace NS] [--as NAME]", "put an agent kind back under the file's limits",
			"Drops an operator's limits of the kind: the workflows file's (as the schedulers stored them) hold again. With --namespace, drops that namespace's own limits on the kind: the kind's hold its steps alone. Recorded as set is.", dbEnv},
		{"partitions show", "[--file FILE] [--json]", "the partitions layout: each partition and its buckets",
			"Shows a partitioned deployment's layout (--file, else SAS_PARTITIONS_FILE): the routing exchange, the number of buckets and, per partition, its queue prefix, the environment variable holding its database URL and the buckets it owns.", []string{"SAS_PARTITIONS_FILE"}},
		{"partitions setup", "[--file FILE] [--renumber]", "declare the partitions' routing on the broker",
			"Declares the layout's routing on the broker: the x-consistent-hash exchange applications publish submits to (the order id as routing key; the rabbitmq_consistent_hash_exchange plugin must be enabled), a fanout exchange per bucket bound to it in bucket order, and each bucket bound to its partition's submit entrance (PREFIX submit), and to no other partition's. Safe to run again; run it as a broker login that may configure those exchanges. A broker node that restarts numbers the buckets in an order of its own, so some submits reach another partition, whose submitter passes them on; --renumber binds every bucket again in bucket order, after which each reaches its own.", append(slices.Clone(brokerEnv), "SAS_PARTITIONS_FILE")},
		{"partitions of", "ID... [--file FILE]", "which bucket and partition an order id belongs to",
			"Prints each order id's bucket and partition, as the routing exchange computes them.", []string{"SAS_PARTITIONS_FILE"}},
		{"partitions add", "NAME --queue-prefix PREFIX --database-url-env VAR [--file FILE]", "add a partition to the layout, owning no bucket",
			"Adds a partition to the layout file (written again whole; comments are not kept), marked added: it owns no bucket until buckets are moved to it, and the others keep theirs. With its URL and the first partition's set, its store learns the buckets moved before it (migrate its database first). Then give every process the new file, start its services and run partitions setup and partitions move.", []string{"SAS_PARTITIONS_FILE"}},
		{"partitions move", "BUCKET to PARTITION [--file FILE] [--no-wait] [--as NAME]", "move a bucket to another partition while orders flow",
			"Moves a bucket's new orders to another partition: the new owner holds the bucket's submits while the ids its old owner wrote are copied to it, the old owner is fenced (it writes no order of the bucket after its writes in flight end), the ids are copied again, the new owner writes the bucket's orders (a submit retried across the move is a duplicate there, never a second order) and the bucket's exchange is bound to it. An order stays in the store that wrote it: the bucket's running orders end where they are, and the move is done when none is left (--no-wait returns before). Recorded in the first partition's store; run it again to resume a move that stopped. Needs every partition's URL and a broker login that may bind the bucket exchanges.", append(slices.Clone(brokerEnv), "SAS_PARTITIONS_FILE")},
		{"partitions compose", "[--file FILE] [--base docker-compose.yml] [--layout ./partitions.yaml] [--out FILE]", "a Compose file running the layout's partitions",
			"Writes a Compose file that, laid over deploy/docker-compose.yml (docker compose -f docker-compose.yml -f THIS up), runs the layout's partitions: the base file's services are the first partition's, each other partition gets its own PostgreSQL (postgres-NAME, its own volume), migration, logins, submitter, scheduler, agent and supervisor, the console, the API and sasctl read every partition's store, the broker users get rights under every partition's prefix, and a one-shot service runs partitions setup. The layout is mounted from --layout (a path from the compose project's folder).", []string{"SAS_PARTITIONS_FILE"}},
		{"partitions moves", "[--file FILE] [--json] [--limit N]", "every move of a bucket and how far it got",
			"Lists the moves of buckets, newest first: the bucket, from and to, its state (copying, draining: the new owner writes its orders and the old one's are ending, done), the ids copied, the orders still running in the old owner, when and by whom. With every partition's URL set, a draining move's count is read afresh first, and one drained recorded done. A bucket may move on while an earlier move of it drains.", []string{"SAS_PARTITIONS_FILE"}},
		{"schedules list", "[--json]", "the schedules: next and last tick, last order",
			"Lists the schedules of the workflows file as the supervisors stored them: cron and time zone, workflow, overlap and catch-up, whether paused (and by whom), the next and the last tick, and the last order started with its status. A schedule no longer in the file is shown as such; it starts nothing.", dbEnv},
		{"limits pause", "KIND [--reason TEXT] [--as NAME]", "pause an agent kind: none of its steps is claimed",
			"Pauses an agent kind: no step of it is claimed, in any order, until sasctl limits resume KIND (limits set KIND --rate 0 does the same); steps in flight end normally. Recorded with the operator.", dbEnv},
		{"limits resume", "KIND [--as NAME]", "resume a paused agent kind",
			"Resumes a paused agent kind: its pending steps are claimed again. Recorded with the operator.", dbEnv},
		{"schedules pause", "NAME [--as NAME]", "stop a schedule's ticks",
			"Pauses a schedule: its ticks start no order until it is resumed (a trigger still does). Recorded with the database login running sasctl and the name given with --as.", dbEnv},
		{"schedules resume", "NAME [--as NAME]", "start a paused schedule's ticks again",
			"Resumes a paused schedule from its next tick after now: the ticks missed while it was paused are not caught up. Recorded as pause is.", dbEnv},
		{"schedules trigger", "NAME [--as NAME] [--wait D]", "start a schedule's order now",
			"Asks the leading supervisor to start an order of the schedule now, out of its ticks and whatever its overlap, and waits (--wait, 10s) to say which. Recorded as pause is.", dbEnv},
		{"alerts tail", "[--count N] [--timeout D] [--since D] [--namespace NS]", "print alerts as they are raised",
			"Prints alerts as they are raised (and, with --since, those raised within D before), read from the state store: it consumes nobody's copy. Stops after N alerts or D, or at Ctrl-C.", dbEnv},
		{"dlq list", "[QUEUE] [--reason R] [--limit N] [--json] [--workflows FILE] [--namespace NS]", "dead letters: id, reason, origin, age, body",
			"Lists the messages in the dead-letter queues (QUEUE: submit, replies, agent.KIND for each agent kind of the workflows file, --workflows else SAS_WORKFLOWS_FILE else the built-in one, as the services read it; with or without the prefix and .dlq; default every one) with their message id, reason, detail, original queue, age and the start of their body. --namespace keeps those sas found to be of that namespace (x-sas-namespace: a submit or signal its publisher's login was granted the namespace for; the rest are the deployment's). Reading them leaves them where they are.", workflowsEnv},
		{"dlq show", "ID [--queue Q] [--workflows FILE] [--namespace NS]", "one dead letter in full",
			"Shows dead letters with message id ID in full: headers read as reason, detail, origin and age, and the whole body.", workflowsEnv},
		{"dlq requeue", "ID | --reason R | --all [--queue Q] [--workflows FILE] [--namespace NS]", "publish dead letters back to their queue",
			"Publishes the chosen dead letters to the queue they came from, each confirmed by the broker before it is removed from the dead-letter queue: a kill at any moment loses nothing (at worst a message is in both queues, and consumers take a repeat as one message). A message that is still bad is dead-lettered again.", workflowsEnv},
		{"dlq discard", "ID | --reason R | --all [--queue Q] [--yes] [--workflows FILE] [--namespace NS]", "delete dead letters",
			"Deletes the chosen dead letters for good, after asking (--yes for scripts), and prints each one it dropped.", workflowsEnv},
		{"agent check", "URL [--action A] [--path P] [--undo-action U] [--undo-path P] [--payload JSON|@FILE] [--headers-file F] [--callback-listen ADDR | --signals-queue Q] [--callback-wait D]", "check that a service keeps the remote-service contract",
			"Calls the service at URL as an agent would (POST URL/v1/ACTION, or URL+PATH) under new idempotency keys and checks the contract of docs/remote-service.openapi.yaml: a call is done; the same key twice gives the same answer; the same key with another body gives 422; calls at once with one key give one result (the others 409 or a replay); a call past its deadline is refused or harmless; a call it cannot read is refused for good, and the refusal is not kept as the key's answer; the undo (--undo-action, default undo_ACTION) of a done action is done, and of an action that never ran is done while the action cannot happen after it. A service that answers the first call 202 Accepted is checked on the callback path instead: its Sas-Heartbeat, if any, reads; the same key again is not worked on anew; a later attempt (a new Sas-Step-Token) is taken; a call it cannot read is refused; and its callback comes, with the newest token, within --callback-wait (30s): over HTTP to the API's callback routes served here at --callback-listen ADDR (point the service at http://ADDR/api/v1 instead of the sas API; a token of an earlier attempt is answered 409 stale_token as sas would), or on the queue --signals-queue names (a test queue the service is pointed at, watched here; never the schedulers' own). Prints each rule with PASS or FAIL and exits 1 if any failed. The calls apply the action: point it at a test instance or an action that is safe to repeat.", nil},
		{"workflows check", "FILE", "check a workflows file, listing every problem",
			"Reads a workflows file as the services would and prints every problem as FILE:LINE: what is wrong, what to write instead; exits 1 if there is any. A good file prints each workflow with its version (the hash of what runs: comments and layout do not change it).", nil},
		{"workflows test", "FILE [CASES...] [--run REGEXP] [--coverage] [--junit OUT.xml] [-v]", "run a workflows file's test cases with scripted services and virtual time",
			"Runs each case of the cases files (default: FILE with .cases.yaml in place of its extension) as an order of its workflow through the real state machine: the store's functions on a schema of its own in SAS_DATABASE_URL's database (made, then dropped), the scheduler's decisions for each claimed step, the supervisor's sweeps, timers and deadlines. The services answer as each case scripts (a result, a refusal, transient failures then a result, a 202 and a callback later, no answer at all), signals come when it says, and time is virtual: whenever nothing else can happen the clock jumps to the next moment something falls due, so a 14-day timer takes milliseconds. Prints a line per case as go test does, with the differences and the order's path for each failure, and exits 1 if any failed; --junit also writes JUnit XML; --coverage lists which steps, branches, failures, compensations and wait timeouts the cases exercised and which none did. The format is in docs/YOUR-PROCESS.md.", dbEnv},
		{"workflows pause", "NAME [--reason TEXT] [--as NAME]", "pause a workflow: its orders, and those submitted meanwhile",
			"Pauses a workflow: every order of it that runs is paused as orders pause does, and every order of it submitted while it is paused is written, received, and waits paused (it is not refused). Recorded with the operator.", dbEnv},
		{"workflows resume", "NAME [--as NAME]", "resume a workflow and the orders paused with it",
			"Resumes a paused workflow and the orders paused with it; an order paused on its own stays paused. Recorded with the operator.", dbEnv},
		{"workflows list", "[--file FILE] [--json]", "the workflow versions orders run",
			"Lists every workflow version the state store keeps (each version an order was submitted with) with how many of its orders are in flight, when it was first used and by which submitter; with --file, the workflows of a file and their versions.", dbEnv},
		{"dev", "[--orders N] [--workflows FILE] [--endpoints FILE] [--workflow W] [--payload JSON|@FILE] [--console-port P] [--keep] [flags]", "run every service locally and push orders through",
			"Runs every service on this machine (with --workflows, every service reads that workflows file; the agents serve all its agent kinds, each at the service the endpoints file names for it, --endpoints else SAS_AGENT_ENDPOINTS_FILE, or else at the demo service, and it says which goes where; --payload gives the orders' payload), the web console on --console-port (users from --console-users, else an operator admin with a random password, printed) (and a local Prometheus with the alert rules, if installed), submits N sample orders with live progress, prints a summary, and stops everything, removing the run's folders (its logs, the console's users file; --keep: keeps running until Ctrl-C, and keeps them). It uses the PostgreSQL and RabbitMQ that SAS_DATABASE_URL and SAS_AMQP_URL name; where either is on this machine and does not answer (installed but stopped, or the user is not root), it starts its own as the current user (initdb into a temporary folder; a RabbitMQ node with its own data folder, node name, ports and port mapper), on free ports, and removes them when it ends (--keep: keeps their folder); with neither installed, it says what to install.", append(slices.Clone(both), "SAS_WORKFLOWS_FILE", "SAS_AGENT_ENDPOINTS_FILE", "SAS_CONSOLE_USERS_FILE")},
		{"bench", "[--rate R] [--workflow W] [--against DIR --rounds N | --backlog N] [flags]", "load-test every service locally",
			"Runs every service on this machine under load and reports throughput, latency with a per-stage breakdown, CPU and memory per process, and the queues' depths. Each run is on a fresh schema of the database, migrated and dropped by the run (--fresh=false: the database as it is). With --against DIR, runs another build's binaries (A) and these (B) alternately, --rounds times each, and prints every run and the ratio B/A of every figure (make bench-ab). With --backlog N, queues N orders with the schedulers and agents stopped, then starts them and reports the time to drain and every process's peak memory (make bench-backlog). With --prefill N, the fresh store first holds N orders as they look once run, vacuumed (make bench-steady). With --statements N, reports the N statements that took the database the most time in the window, per order (the server must load pg_stat_statements: make bench-statements).", both},
		{"probe", "URL", "exit 0 if URL answers 200",
			"Gets URL and exits 0 when it answers 200 within 3 s (a container healthcheck: the images have no shell).", nil},
		{"broker users", "[--user-prefix P] [--vhost V]", "print rabbitmqctl commands for least-privilege users",
			"Prints the rabbitmqctl commands that create one RabbitMQ user per service (submitter, scheduler, agent, sasctl) and one for applications (app: publishes to the submit exchange, declares and reads its own sas.client.* reply queues) with only the permissions it needs on SAS_QUEUE_PREFIX; passwords are read by the shell from SAS_AMQP_PASSWORD_<SERVICE>, never printed.", []string{"SAS_QUEUE_PREFIX", "SAS_AMQP_PASSWORD_<SERVICE> (by the printed commands)"}},
		{"db users", "[--login-suffix S] | --operator NAME", "create database logins per service, or for one operator",
			"Creates or updates a login per service role (sas_<service><suffix>) from each SAS_DB_PASSWORD_<SERVICE> that is set. With --operator NAME, creates or updates the login NAME of a person in role sas_operator, with the password read from the first line of standard input: each operator then acts under a login of their own, which the history records. Any character works in a password.", append(slices.Clone(dbEnv), "SAS_DB_PASSWORD_SUBMITTER", "SAS_DB_PASSWORD_SCHEDULER", "SAS_DB_PASSWORD_SUPERVISOR", "SAS_DB_PASSWORD_OPERATOR", "SAS_DB_PASSWORD_CONSOLE", "SAS_DB_PASSWORD_API")},
		{"console user add", "NAME --role viewer|operator [--namespace NS]... [--file FILE] [--cost N]", "make a console user (a bcrypt hash of the password)",
			"Reads the password from the first line of standard input and writes NAME:ROLE:HASH (a bcrypt hash) to FILE, replacing NAME's line if it is there and creating the file (mode 0600) if not; without --file, prints the line (for SAS_CONSOLE_USERS, where entries are separated by ';'). The console reads the file again when it changes: a removed user is logged out at the next click.", nil},
		{"secrets init", "[--dir D] [--owner FILE=UID[:GID]]... [--user-prefix P] [--admin-user U]", "make a deployment's secrets, once",
			"Writes into D (default /run/secrets/sas, the compose file's secrets volume) every password a deployment needs that is not there yet, each in a file of its own (postgres, rabbitmq, db-<role>, amqp-<service>, grafana-admin, console-admin: 32 random base64 characters), and from them the console's users file (admin, an operator), RabbitMQ's definitions (every broker user of sasctl broker users with a salted hash of its password and its rights) and a rabbitmq.conf that loads them at boot. Never replaces a password and never prints one: run it on every start. Files are mode 0440; --owner gives each its reader (needs root).", []string{"SAS_QUEUE_PREFIX"}},
		{"secrets show", "NAME [--dir D]", "print one secret made by secrets init",
			"Prints the secret NAME from D: how an operator reads the console's admin password (console-admin) or Grafana's (grafana-admin).", nil},
		{"version", "", "print sasctl's version", "Prints the version and the source revision sasctl was built from.", nil},
	}
}

// docFor returns the doc of the command at path.
func docFor(path string) (doc, bool) {
	for _, d := range docs() {
		if d.path == path {
			return d, true
		}
	}
	return doc{}, false
}

// groups are the first words of commands that have subcommands.
func isGroup(name string) bool {
	for _, d := range docs() {
		if strings.HasPrefix(d.path, name+" ") {
			return true
		}
	}
	return false
}

// printUsage prints the list of commands.
func printUsage(w io.Writer) {
	fmt.Fprint(w, "usage: sasctl <command> [flags]\n\nsasctl is sas's operator and developer tool.\n\ncommands:\n")
	for _, d := range docs() {
		fmt.Fprintf(w, "  %-20s %s\n", d.path, d.summary)
	}
	fmt.Fprint(w, "\nRun \"sasctl <command> -h\" for a command's arguments, flags and environment.\n"+
		"Every command reads SAS_LOG_LEVEL; see the README for every variable.\n")
}

// printGroup prints the commands of a group.
func printGroup(w io.Writer, group string) {
	fmt.Fprintf(w, "usage: sasctl %s <command> [flags]\n\ncommands:\n", group)
	for _, d := range docs() {
		if strings.HasPrefix(d.path, group+" ") {
			fmt.Fprintf(w, "  %-20s %s\n", d.path, d.summary)
		}
	}
	fmt.Fprintf(w, "\nRun \"sasctl %s <command> -h\" for a command's arguments, flags and environment.\n", group)
}

// printHelp prints a command's full help with its flags.
func printHelp(w io.Writer, d doc, fs *flag.FlagSet) {
	fmt.Fprintf(w, "usage: sasctl %s %s\n\n%s\n", d.path, d.args, wrap(d.detail, 78, ""))
	if fs != nil {
		n := 0
		fs.VisitAll(func(*flag.Flag) { n++ })
		if n > 0 {
			fmt.Fprint(w, "\nflags:\n")
			out := fs.Output()
			fs.SetOutput(w)
			fs.PrintDefaults()
			fs.SetOutput(out)
		}
	}
	fmt.Fprint(w, "\nenvironment:\n")
	for _, e := range append(slices.Clone(d.env), "SAS_LOG_LEVEL") {
		fmt.Fprintf(w, "  %s\n", e)
	}
}

// wrap breaks text into lines of at most width runes, each after the
// first starting with indent (counted in width); a word longer than a line
// is cut.
func wrap(text string, width int, indent string) string {
	room := width - len([]rune(indent))
	var b strings.Builder
	line := 0 // runes on the current line, after the indent
	for _, word := range strings.Fields(text) {
		r := []rune(word)
		for len(r) > 0 {
			switch {
			case line > 0 && line+1+len(r) <= room:
				b.WriteByte(' ')
				line++
			case line > 0:
				b.WriteString("\n" + indent)
				line = 0
			}
			n := min(len(r), room)
			b.WriteString(string(r[:n]))
			line += n
			r = r[n:]
		}
	}
	return b.String()
}

// version describes the build, from the binary's build information.
func version() string {
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return "sasctl (no build information)"
	}
	v := "sasctl " + info.Main.Version
	var rev, at string
	modified := false
	for _, s := range info.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.time":
			at = s.Value
		case "vcs.modified":
			modified = s.Value == "true"
		}
	}
	if rev != "" {
		v += " commit " + rev
		if modified {
			v += " (with local changes)"
		}
	}
	if at != "" {
		v += " of " + at
	}
	return v + ", " + info.GoVersion
}
