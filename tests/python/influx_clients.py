"""The Python InfluxDB clients from PyPI against a timeshard node's HTTP side.

influxdb-client (InfluxDB 2.x API) writes through /api/v2/write with gzip; influxdb (the 1.x
client) writes through /write and reads everything back with InfluxQL through /query. A string
field is refused with InfluxDB's partial-write answer, which the v2 client raises as an error.
Run by tests/tests/http_clients.rs: python3 influx_clients.py URL TOKEN
"""

import sys
from urllib.parse import urlparse

import influxdb
from influxdb_client import InfluxDBClient, Point, WritePrecision
from influxdb_client.client.write_api import SYNCHRONOUS
from influxdb_client.rest import ApiException

T = 1_699_999_980  # a whole minute, seconds since the epoch


def check(what, got, want):
    if got != want:
        raise AssertionError(f"{what}: got {got!r}, want {want!r}")


def main(url, token):
    # v2: points with several fields and types, gzip-compressed, second precision.
    with InfluxDBClient(url=url, token=token, org="edge", enable_gzip=True) as v2:
        write = v2.write_api(write_options=SYNCHRONOUS)
        points = [
            Point("weather").tag("station", "s 1").field("temp", 20.0 + i).field("wet", i % 2 == 0).time(T + i, WritePrecision.S)
            for i in range(60)
        ]
        write.write(bucket="sensors", record=points, write_precision=WritePrecision.S)
        write.write(bucket="sensors", record="weather,station=s2 temp=-3.5 %d" % (T * 1_000_000_000))
        try:
            write.write(bucket="sensors", record='weather,station=s3 note="hello",temp=1 %d' % (T * 1_000_000_000))
            raise AssertionError("a string field was accepted")
        except ApiException as e:
            check("status of a string field", e.status, 400)
            if "partial write" not in e.body or "is a string" not in e.body:
                raise AssertionError(f"unexpected answer to a string field: {e.body}")
        check("v2 ping", v2.ping(), True)

    # v1: writes with millisecond precision, token as the password.
    host = urlparse(url)
    v1 = influxdb.InfluxDBClient(host=host.hostname, port=host.port, username="edge", password=token, database="sensors")
    v1.write_points(
        [{"measurement": "meter", "tags": {"id": "7"}, "time": T * 1000 + i * 500, "fields": {"kwh": float(i), "pulses": i}}
         for i in range(10)],
        time_precision="ms",
    )

    # Read back what both wrote, through InfluxQL.
    rs = v1.query(f"SELECT temp, wet FROM weather WHERE station = 's 1' AND time >= {T}s", epoch="s")
    rows = list(rs.get_points(measurement="weather"))
    check("rows of weather", len(rows), 60)
    check("first row", (rows[0]["time"], rows[0]["temp"], rows[0]["wet"]), (T, 20.0, 1.0))
    check("last row", (rows[-1]["time"], rows[-1]["temp"], rows[-1]["wet"]), (T + 59, 79.0, 0.0))
    # Chunked, as the client reads it: one result set per line, 7 rows at most in each.
    chunks = list(v1.query(f"SELECT temp, wet FROM weather WHERE station = 's 1' AND time >= {T}s", epoch="s",
                           chunked=True, chunk_size=7))
    check("chunks", len(chunks), 9)
    check("chunked rows", [r for rs in chunks for r in rs.get_points(measurement="weather")], rows)
    rs = v1.query(f"SELECT mean(temp), count(temp) FROM weather WHERE time >= {T}s AND time < {T + 60}s GROUP BY station")
    by_station = {tags["station"]: list(points)[0] for (_, tags), points in rs.items()}
    # s3 is the line with a string field: its number was stored.
    check("stations", sorted(by_station), ["s 1", "s2", "s3"])
    check("mean of s 1", by_station["s 1"]["mean"], sum(20.0 + i for i in range(60)) / 60)
    check("s2", (by_station["s2"]["mean"], by_station["s2"]["count"]), (-3.5, 1))
    rs = v1.query(f"SELECT sum(kwh), max(pulses) FROM meter WHERE id = '7' AND time >= {T}s AND time < {T + 5}s GROUP BY time(1s)", epoch="ms")
    rows = list(rs.get_points())
    check("windows of meter", [(r["time"], r["sum"], r["max"]) for r in rows[:3]],
          [(T * 1000, 1.0, 1.0), (T * 1000 + 1000, 5.0, 3.0), (T * 1000 + 2000, 9.0, 5.0)])
    check("measurements", sorted(m["name"] for m in v1.get_list_measurements()), ["meter", "weather"])
    check("databases", v1.get_list_database(), [{"name": "timeshard"}])
    tags = list(v1.query("SHOW TAG VALUES FROM weather WITH KEY = station").get_points())
    check("tag values", sorted(t["value"] for t in tags), ["s 1", "s2", "s3"])
    try:
        v1.query("SELECT temp FROM weather WHERE station =~ /s.*/")
        raise AssertionError("a regular expression was accepted")
    except influxdb.exceptions.InfluxDBClientError as e:
        if "unsupported InfluxQL: regular expressions" not in str(e):
            raise AssertionError(f"unexpected error: {e}")
    print("influx clients: ok")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
