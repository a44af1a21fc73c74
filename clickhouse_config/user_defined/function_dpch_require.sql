CREATE FUNCTION dpch_require AS (ok, message) -> tupleElement(CAST(tuple(toUInt8(0)) AS Tuple(ok UInt8)), if(ok, 'ok', message))
