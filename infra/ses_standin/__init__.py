"""A faithful local stand-in for Amazon SESv2 (REST-JSON, used through the real boto3 client).

Run it with `python -m infra.ses_standin --port PORT --state-dir DIR`; drive its faults and
read its statistics with `infra.ses_standin.admin.SesStandinAdmin`.
"""
