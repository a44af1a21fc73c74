-- Accepted analyst queries (one per line; run with epsilon=1, delta=1e-6 unless a trailing
-- "-- delta=0" is given). Tables: see tests/test_controller_fixtures.py.
SELECT COUNT(*) FROM t_controller.purchases
SELECT count() AS n FROM t_controller.purchases
SELECT COUNT(1) FROM t_controller.purchases WHERE age > 30
SELECT SUM(amount) FROM t_controller.purchases
SELECT AVG(age) AS a FROM t_controller.purchases
SELECT region, COUNT(*) AS n FROM t_controller.purchases GROUP BY region
SELECT region, COUNT(*) AS n, SUM(amount) AS revenue, AVG(age) AS mean_age FROM t_controller.purchases WHERE age >= 30 GROUP BY region
SELECT region, SUM(price * qty) AS v FROM t_controller.purchases GROUP BY region
SELECT AVG(2*age + 1) FROM t_controller.purchases
SELECT COUNT(DISTINCT user_id) FROM t_controller.purchases
SELECT region, COUNT(DISTINCT user_id) AS users FROM t_controller.purchases GROUP BY region
SELECT VAR_POP(amount), STDDEV_POP(amount) FROM t_controller.purchases
SELECT varSamp(age) AS v, stddevSamp(age) AS s FROM t_controller.purchases
SELECT VARIANCE(qty), STDDEV(qty) FROM t_controller.purchases
SELECT countIf(amount > 100) AS big FROM t_controller.purchases
SELECT sumIf(amount, region = 'EU') FROM t_controller.purchases
SELECT avgIf(age, flag) FROM t_controller.purchases
SELECT region, COUNT(*) AS n FROM t_controller.purchases GROUP BY region HAVING n > 10 ORDER BY n DESC LIMIT 2
SELECT region, SUM(amount) / COUNT(*) AS avg_amount FROM t_controller.purchases GROUP BY region
SELECT region, round(AVG(age), 1) AS a FROM t_controller.purchases GROUP BY region ORDER BY a
SELECT lower(region) AS r, COUNT(*) AS n FROM t_controller.purchases GROUP BY r
SELECT p.region, COUNT(*) FROM t_controller.purchases AS p WHERE p.age > 20 GROUP BY p.region
SELECT region, COUNT(*) FROM t_controller.purchases GROUP BY 1
SELECT region, COUNT(*) AS n FROM t_controller.purchases GROUP BY region ORDER BY 2 DESC
SELECT COUNT(price) FROM t_controller.purchases
SELECT AVG(price) FROM t_controller.purchases
SELECT SUM(abs(amount - 250)) FROM t_controller.purchases
SELECT SUM(least(amount, 100)) AS capped FROM t_controller.purchases
SELECT SUM(greatest(qty, 2) * 3) FROM t_controller.purchases
SELECT SUM(CASE WHEN region = 'EU' THEN amount ELSE 0 END) FROM t_controller.purchases
SELECT SUM(if(age > 50, 1, 0)) FROM t_controller.purchases
SELECT SUM(amount > 300) FROM t_controller.purchases
SELECT AVG(amount / 10) FROM t_controller.purchases
SELECT SUM(pow(qty, 2)) FROM t_controller.purchases
SELECT AVG(sqrt(amount)) FROM t_controller.purchases
SELECT SUM(toFloat64(qty)) FROM t_controller.purchases
SELECT qty, COUNT(*) FROM t_controller.purchases GROUP BY qty -- delta=0
SELECT intDiv(age, 10) AS decade, COUNT(*) FROM t_controller.purchases GROUP BY decade -- delta=0
SELECT region, qty, COUNT(*) FROM t_controller.purchases GROUP BY region, qty -- delta=0
SELECT COUNT(*) * 2 + 1 AS x, 'const' AS c FROM t_controller.purchases
SELECT COUNT(*) FROM t_controller.purchases WHERE region IN ('EU', 'US') AND day >= toDate('2024-03-01')
SELECT COUNT(*) FROM t_controller.purchases WHERE category LIKE 'c1%' OR toYear(day) = 2024
SELECT region, COUNT(*) FROM t_controller.purchases WHERE lower(category) = 'c3' GROUP BY region
SELECT SUM(amount) AS s FROM t_controller.purchases WHERE price IS NULL
SELECT region, AVG(age) AS a, COUNT(*) AS n FROM t_controller.purchases GROUP BY region HAVING a > 20 AND n > 0
SELECT region FROM t_controller.purchases GROUP BY region -- delta=0
SELECT region, COUNT(*) AS n FROM t_controller.purchases GROUP BY region HAVING COUNT(*) > 5
SELECT region, COUNT(*) FROM t_controller.purchases GROUP BY region ORDER BY SUM(amount) DESC
SELECT region, COUNT(*) AS n FROM t_controller.purchases GROUP BY region ORDER BY region DESC NULLS LAST LIMIT 3 OFFSET 1
SELECT SUM(multiIf(qty < 3, 1, qty < 6, 2, 3)) FROM t_controller.purchases
SELECT SUM(coalesce(price, 0)) FROM t_controller.purchases
SELECT AVG(-amount) FROM t_controller.purchases
SELECT SUM(floor(amount / 7)) FROM t_controller.purchases
SELECT region, COUNT(*) AS n FROM t_controller.events GROUP BY region
SELECT category, COUNT(DISTINCT user_id) AS users FROM t_controller.events GROUP BY category
SELECT category, region, SUM(amount) FROM t_controller.events GROUP BY category, region
SELECT toMonth(day) AS m, AVG(amount) FROM t_controller.events GROUP BY m
SELECT region, STDDEV_SAMP(age) FROM t_controller.events GROUP BY region
SELECT COUNT(*), SUM(qty) FROM t_controller.events
SELECT category FROM t_controller.events GROUP BY category
SELECT region, COUNT(*) AS n, AVG(amount) FROM t_controller.rowlevel GROUP BY region
SELECT category, COUNT(*) FROM t_controller.rowlevel GROUP BY category
SELECT SUM(qty) FROM t_controller.rowlevel WHERE flag
SELECT COUNT(*), AVG(age) FROM t_controller.subst
SELECT region, SUM(amount) FROM t_controller.subst GROUP BY region
SELECT category, COUNT(DISTINCT user_id) FROM t_controller.subst GROUP BY category
SELECT MIN(amount) AS lo, MAX(amount) AS hi FROM t_controller.purchases -- delta=0
SELECT median(amount) AS m, quantile(0.9)(price) AS p90 FROM t_controller.purchases -- delta=0
SELECT region, quantiles(0.1, 0.5, 0.9)(amount) AS qs, COUNT(*) AS n FROM t_controller.purchases GROUP BY region -- delta=0
SELECT category, median(qty) AS m FROM t_controller.events GROUP BY category
SELECT region, MAX(amount) - MIN(amount) AS spread FROM t_controller.rowlevel GROUP BY region -- delta=0
SELECT COUNT(DISTINCT region) AS r, COUNT(DISTINCT category) AS c FROM t_controller.purchases -- delta=0
SELECT region, COUNT(DISTINCT category) AS c FROM t_controller.events GROUP BY region
SELECT COUNT(DISTINCT user_id) AS users FROM t_controller.rowlevel -- delta=0
-- ClickHouse habits (issue 31): the DP distinct count, the -If forms, date group keys
SELECT minIf(amount, qty > 3) AS lo, maxIf(amount, qty > 3) AS hi FROM t_controller.purchases
SELECT uniq(user_id) AS u, uniqExact(user_id) AS e, uniqCombined(category) AS c FROM t_controller.purchases
SELECT region, uniqIf(category, qty > 3) AS c, countIf(qty > 3) AS n FROM t_controller.purchases GROUP BY region
SELECT toStartOfMonth(day) AS m, COUNT(*) AS n FROM t_controller.purchases GROUP BY m
SELECT toDayOfWeek(day) AS w, uniq(user_id) AS u FROM t_controller.purchases GROUP BY w
