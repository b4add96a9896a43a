-- The W3C traceparent of an order's trace (OpenTelemetry), written by the
-- submitter when tracing is on: every later span of the order (claims by
-- any scheduler replica, supervisor resets, status events), in whatever
-- process and after whatever restart, joins that trace through it. NULL
-- when tracing is off. A short text, so an order's row grows by about 56
-- bytes with tracing on and by nothing without.
ALTER TABLE orders ADD COLUMN traceparent text CHECK (traceparent IS NULL OR length(traceparent) <= 128);
