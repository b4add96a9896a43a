-- A sub-process that completed is undone when its parent is undone later
-- (step_undo_child calls begin_compensation on the child, as the docs
-- promise), but 0034's table of order moves left out completed to
-- compensating: the door refused the move, the parent's undo of the child
-- failed at every claim until its step ran out of failures, and the
-- parent stayed compensating. `sasctl workflows test` found it on the
-- loan example (a payout refused after the identity check completed).
INSERT INTO order_moves (from_status, to_status) VALUES ('completed', 'compensating')
ON CONFLICT DO NOTHING;
