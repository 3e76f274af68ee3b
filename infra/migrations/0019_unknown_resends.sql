-- `flashsend campaign resend-unknown` (producers/resend_unknown.py): every time rows that were
-- `unknown` are queued to be mailed again, who did it, when, why and exactly which rows, so
-- "why did this user get the mail twice?" is answered by a query. Rows are only ever inserted,
-- in the transaction that moves the rows (sinks/sql/resolution.sql, resend_unknown).
CREATE TABLE unknown_resends (
    id              bigserial        PRIMARY KEY,
    requested_by    text             NOT NULL,
    host            text             NOT NULL,
    reason          text             NOT NULL,
    campaign_id     bigint           NOT NULL,
    campaign_status text             NOT NULL,  -- before the resend (done goes back to sending)
    older_than_s    double precision NOT NULL,  -- the grace: calls started longer ago than this
    recipients      integer          NOT NULL,  -- rows moved to pending
    seqs            integer[]        NOT NULL,  -- exactly those rows
    created_at      timestamptz      NOT NULL DEFAULT now()
);
CREATE INDEX unknown_resends_campaign ON unknown_resends (campaign_id, created_at);
