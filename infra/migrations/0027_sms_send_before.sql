-- Quiet hours for SMS: the end of the recipient's local send window. The sender texts a row
-- only before it (streams/sms_channel.py); past it the row is skipped, 'quiet_hours', rather
-- than sent into the night. NULL for email rows and for campaigns without a window. Nullable,
-- no default: no table rewrite; the campaigns' partitions take the column with their parent.
ALTER TABLE campaign_recipients ADD COLUMN send_before timestamptz;
