-- When a claimed row's SES call was about to start (enter_call). A row claimed but never in a
-- call was certainly not sent: when its lease expires it goes back to pending and is sent
-- later. Only a row whose call started can end unknown. No index: read only with the
-- campaign's rows already selected by the primary key.
ALTER TABLE campaign_recipients ADD COLUMN IF NOT EXISTS in_call_at timestamptz;
