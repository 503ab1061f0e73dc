"""Replayed neighbours of the kinds of issues #11, #32 and #43 that still read wrong: units
beside units and medical or cooking units, angles, feet and inches, powers and functions in a
formula, codes after identifier words, 两 where no count is said, English abbreviations before
a number, video resolutions, mixed numbers, years after a quarter or in brackets, am/pm ranges
and a dot before a name; ratings, scientific notation, model and house numbers, spaced units, numbers
that name a day or a service, sections and doses, race times and day.month.year dates. Each case is read
with and without WeTextProcessing."""

from __future__ import annotations

import pytest

from chattts_serving.text.normalize import normalize
from tests.support.readings import assert_read

# A unit glued to a number says nothing of the language around it: the second operand of a spec or a size stays
# Chinese.
UNITS_BESIDE_UNITS = [
    ('内存12GB+256GB。', '内存十二GB加二百五十六GB。'),
    ('8+128G版本。', '八加一百二十八G版本。'),
    ('2m×3m的地毯。', '两米乘以三米的地毯。'),
    ('长宽高为10×20×30cm。', '长宽高为十乘以二十乘以三十厘米。'),
    ('电池5000mAh和65W快充。', '电池五千毫安时和六十五瓦快充。'),
    ('30cm×40cm', 'thirty centimeters by forty centimeters'),
    ('He weighs 80kg and is 1.8m tall.', 'He weighs eighty kilograms and is one point eight meters tall.'),
]

# Medical, consumption, cooking and shorthand units, in both languages.
MORE_UNITS = [
    ('血糖6.1mmol/L，肌酐80μmol/L。', '血糖六点一毫摩尔每升，肌酐八十微摩尔每升。'),
    ('空腹血糖126mg/dL。', '空腹血糖一百二十六毫克每分升。'),
    ('油耗6.5L/100km。', '油耗六点五升每百公里。'),
    ('The car gets 30 mpg.', 'The car gets thirty miles per gallon.'),
    ('每天摄入2000kcal。', '每天摄入两千千卡。'),
    ('Add 2 tbsp of sugar and 1 tsp of salt.', 'Add two tablespoons of sugar and one teaspoon of salt.'),
    ('It takes 30 mins.', 'It takes thirty minutes.'),
    ('wait 5 secs', 'wait five seconds'),
    ('He scored 25 pts.', 'He scored twenty five points.'),
    ('There are 7.8bn people.', 'There are seven point eight billion people.'),
    ('Stream in 1080p at 60fps.', 'Stream in ten eighty p at sixty frames per second.'),
    ("That's 50¢.", 'Thats fifty cents.'),
    ('Only 1¢ each.', 'Only one cent each.'),
    ('一支笔50¢。', '一支笔五十美分。'),
    ('The deal is worth £1.2bn.', 'The deal is worth one point two billion pounds.'),
]

# Degrees, minutes and seconds of arc and the hemisphere; a bare degree stays a unit.
ANGLES = [
    ('GPS坐标：31.2304°N，121.4737°E。', 'GPS坐标，北纬三十一点二三零四度，东经一百二十一点四七三七度。'),
    ('北纬39°54′。', '北纬三十九度五十四分。'),
    ('位于北纬40°26′46″，东经116°23′。', '位于北纬四十度二十六分四十六秒，东经一百一十六度二十三分。'),
    ('The summit is at 27°59′17″N.',
     'The summit is at twenty seven degrees fifty nine minutes seventeen seconds north.'),
    ('The ship was at 40°N, 70°W.', 'The ship was at forty degrees north, seventy degrees west.'),
    ("The angle is 30° 45'.", 'The angle is thirty degrees forty five minutes.'),
    ('Turn 45° left.', 'Turn forty five degrees left.'),
    ('角度为45°。', '角度为四十五度。'),
    ('气温45°C。', '气温四十五摄氏度。'),
]

# Feet and inches, minutes and seconds (a pace, a race time); a decade's apostrophe is no foot.
FEET_INCHES = [
    ('She is 5\'6".', 'She is five feet six inches.'),
    ('He is 6\'2" tall.', 'He is six feet two inches tall.'),
    ('他身高6′2″。', '他身高六英尺二英寸。'),
    ("In the '80s.", 'In the eighties.'),
    ("配速5'30''，很快。", '配速五分三十秒，很快。'),
    ('比赛用时1′05″。', '比赛用时一分五秒。'),
    ("My pace is 5'30'' per km.", 'My pace is five minutes thirty seconds per km.'),
]

# Caret exponents, two variables under one power and functions of one argument, never in English inside Chinese.
POWERS = [
    ('10^6', '十的六次方'),
    ('我们有2^10种组合。', '我们有二的十次方种组合。'),
    ('误差约为10^-3。', '误差约为十的负三次方。'),
    ('The answer is 2^10.', 'The answer is two to the power of ten.'),
    ('x^2+y^2=1', 'x的平方加y的平方等于一'),
    ('10^3米', '十的三次方米'),
    ('E = mc²', 'E equals m c squared'),
    ('爱因斯坦的质能方程E=mc²。', '爱因斯坦的质能方程E等于mc的平方。'),
    ('已知f(x)=x²，求f(2)。', '已知fx等于x的平方，求f二。'),
    ('Let f(x) = x² + 1.', 'Let f of x equals x squared plus one.'),
    ('面积5km²。', '面积五平方公里。'),
    ('The area is 25 m².', 'The area is twenty five square meters.'),
]

# Codes and identifiers: letters and numbers joined by hyphens, a number after an identifier word and #, a country
# code.
CODES = [
    ('商品编号：SKU-2024-001。', '商品编号，SKU杠二零二四杠零零幺。'),
    ('Invoice INV-2023-0042 is due.', 'Invoice INV dash two zero two three dash zero zero four two is due.'),
    ('订单号#12345。', '订单号幺二三四五。'),
    ('订单号：#12345。', '订单号，幺二三四五。'),
    ('Order #12345 has shipped.', 'Order number one two three four five has shipped.'),
    ('话题#世界杯#很热。', '话题世界杯很热。'),
    ('国际区号+1。', '国际区号加幺。'),
    ('美国的国际区号是+1。', '美国的国际区号是加幺。'),
    ('涨幅+3。', '涨幅正三。'),
    ('Please call 1-800-FLOWERS.', 'Please call one, eight zero zero, FLOWERS.'),
    ('请拨打1-800-FLOWERS。', '请拨打幺，八零零，FLOWERS。'),
    ('Dial 1-800-555-0199 for help.', 'Dial one, eight zero zero, five five five, zero one nine nine for help.'),
]

# A spaced x between numbers of an equation is its times sign.
SPACED_TIMES = [
    ('In maths, 3 x 4 = 12.', 'In maths, three times four equals twelve.'),
    ('我们知道3 x 4 = 12。', '我们知道三乘以四等于十二。'),
    ('2 x 3 x 4 = 24', '二乘以三乘以四等于二十四'),
    ('Solve x + 2 = 5.', 'Solve x plus two equals five.'),
]

# 两 only where a count is said: a chemical formula's digit is no count; a height's centimetres digit by digit.
NO_LIANG = [
    ('CO2排放。', 'CO二排放。'),
    ('CO₂排放量下降了5%。', 'CO二排放量下降了百分之五。'),
    ('2排座位。', '两排座位。'),
    ('身高1米75。', '身高一米七五。'),
    ('他身高1米65，体重60公斤。', '他身高一米六五，体重六十公斤。'),
    ('1米8的个子。', '一米八的个子。'),
    ('3米50厘米。', '三米五十厘米。'),
]

# No., p., pp. and other abbreviations before a number anywhere in the sentence; a.m. and p.m. alone unchanged.
ENGLISH_ABBREVIATIONS = [
    ('Item No. 5.', 'Item number five.'),
    ('Vol. 3, No. 2.', 'Volume three, number two.'),
    ('See p. 12.', 'See page twelve.'),
    ('See pp. 45-67.', 'See pages forty five to sixty seven.'),
    ('a.m. and p.m.', 'a. m. and p. m.'),
    ('See Ch. 3 and Eq. 5.', 'See Chapter three and Equation five.'),
    ('Call us at ext. 204.', 'Call us at extension two zero four.'),
    ('Tel. 010-12345678', 'Telephone zero one zero, one two three four five six seven eight'),
]

# A video resolution is named by its digits.
RESOLUTIONS = [
    ('1080P高清。', '一零八零P高清。'),
    ('支持2160p输出。', '支持二一六零P输出。'),
    ('The video is in 720p.', 'The video is in seven twenty p.'),
    ('I have 480 points.', 'I have four hundred and eighty points.'),
]

# A whole number and a proper fraction.
MIXED_NUMBERS = [
    ('Add 1 1/2 cups of water.', 'Add one and a half cups of water.'),
    ('It took 2 3/4 hours.', 'It took two and three quarters hours.'),
    ('About 1 1/3 miles.', 'About one and a third miles.'),
    ('加入1 1/2杯水。', '加入一又二分之一杯水。'),
    ('Mix 2 cups of flour with 1/2 cup of milk.', 'Mix two cups of flour with one half cup of milk.'),
]

# A year after a quarter, a half or a fiscal year, and alone in brackets after a title or a cited name; a count in
# brackets after a Chinese word stays one.
YEARS = [
    ('In Q1 2024, sales grew 8%.', 'In Q one twenty twenty four, sales grew eight percent.'),
    ('FY2024 revenue rose.', 'FY twenty twenty four revenue rose.'),
    ('H2 2023 was weak.', 'H two twenty twenty three was weak.'),
    ('Q3 2024营收增长。', 'Q三二零二四营收增长。'),
    ('We shipped 2024 units in Q1.', 'We shipped two thousand and twenty four units in Q one.'),
    ('员工（2000）人。', '员工，两千，人。'),
    ('《流浪地球》（2019）是一部科幻片。', '流浪地球，二零一九，是一部科幻片。'),
    ('Smith (2020) showed this.', 'Smith, twenty twenty, showed this.'),
    ('人数（2000）', '人数，两千'),
    ('收入（3000元）。', '收入，三千元。'),
    ('宁德时代（300750）今日大涨。', '宁德时代，三零零七五零，今日大涨。'),
]

# Two times with am/pm joined by a dash are a range.
AM_PM_RANGES = [
    ('Open 9am-5pm.', 'Open nine AM to five PM.'),
    ('Open Mon–Fri 9am–5pm.', 'Open Monday to Friday nine AM to five PM.'),
    ('Open 9 a.m. - 5 p.m.', 'Open nine AM to five PM.'),
    ('营业时间9am-5pm。', '营业时间上午九点到下午五点。'),
    ('He left at 5 p.m. Then he came back.', 'He left at five PM. Then he came back.'),
]

# A dot before a name (.NET) is said, not a sentence end.
NAME_DOTS = [
    ('使用.NET框架。', '使用 dot NET框架。'),
    ('We use .NET daily.', 'We use dot NET daily.'),
    ('我很好.Thanks a lot.', '我很好。Thanks a lot.'),
    ('See p. 12. Then go.', 'See page twelve. Then go.'),
    ('I said no. Then I left.', 'I said no. Then I left.'),
    ('他说完了.然后走了。', '他说完了。然后走了。'),
]


# A rating out of 5, 10 or 100 after a rating word or before a star; a plain a/b stays a fraction.
RATINGS = [
    ('Rated 4.5/5 stars.', 'Rated four point five out of five stars.'),
    ("I'd give it 9/10.", 'I would give it nine out of ten.'),
    ('评分4.8/5分。', '评分四点八分，满分五分。'),
    ('这家店评分为4.6/5。', '这家店评分为四点六分，满分五分。'),
    ('用户评分4.5/5星。', '用户评分四点五星，满分五星。'),
    ('评分3/5。', '评分三分，满分五分。'),
    ('The ratio is 4/5.', 'The ratio is four fifths.'),
    ('2/5的人同意。', '五分之二的人同意。'),
    ('大约3/4的人同意。', '大约四分之三的人同意。'),
]

# Scientific notation: one digit before the point, E read as times ten to a power; a hash stays letters.
SCIENTIFIC = [
    ('The population is 1e6.', 'The population is one times ten to the power of six.'),
    ('误差是1.5e-3。', '误差是一点五乘以十的负三次方。'),
    ('光速约为3E8米每秒。', '光速约为三乘以十的八次方米每秒。'),
    ('Speed of light is 3E8 m/s.', 'Speed of light is three times ten to the power of eight meters per second.'),
    ('阿伏伽德罗常数是6.02×10²³。', '阿伏伽德罗常数是六点零二乘以十的二十三次方。'),
    ('2e5f是一个哈希。', '二e五f是一个哈希。'),
]

# Model numbers after a maker or series word, an Airbus family's capital, a CPU's family; counts stay counts.
MODEL_NUMBERS = [
    ('I flew on a Boeing 747.', 'I flew on a Boeing seven forty seven.'),
    ('I bought an RTX 4090.', 'I bought an RTX forty ninety.'),
    ('He bought a GTX 1080 Ti.', 'He bought a GTX ten eighty Ti.'),
    ('The A320 is popular.', 'The A three twenty is popular.'),
    ('I have an iPhone 15.', 'I have an iPhone fifteen.'),
    ('我坐的是波音747。', '我坐的是波音七四七。'),
    ('这是空客A320。', '这是空客A三二零。'),
    ('显卡是RTX-4090。', '显卡是RTX 四零九零。'),
    ('CPU是i7-13700K。', 'CPU是i七一三七零零K。'),
    ('The i9-13900K is fast.', 'The i nine thirteen nine hundred K is fast.'),
    ('I use GPT-4o every day.', 'I use GPT four o every day.'),
    ('I have 747 apples.', 'I have seven hundred and forty seven apples.'),
    ('波音公司今年交付了747架飞机。', '波音公司今年交付了七百四十七架飞机。'),
    ('Room A101.', 'Room A one zero one.'),
]

# A house number before a street's name in pairs, a ZIP code after a state digit by digit.
ADDRESSES = [
    ('He lives at 221B Baker Street.', 'He lives at two twenty one B Baker Street.'),
    ('1600 Pennsylvania Avenue NW, Washington, DC 20500.',
     'sixteen hundred Pennsylvania Avenue NW, Washington, DC two zero five zero zero.'),
    ('Apt 4B, 350 Fifth Avenue, New York, NY 10118.',
     'Apartment four B, three fifty Fifth Avenue, New York, NY one zero one one eight.'),
    ('He lives at 10 Downing Street.', 'He lives at ten Downing Street.'),
    ('I scored 900 on the test.', 'I scored nine hundred on the test.'),
    ('In 2024, US 20000 jobs were added.', 'In twenty twenty four, US twenty thousand jobs were added.'),
]

# Units written with a space or in words where the words around say so: feet and inches, metres, amperes, basis
# points (base pairs beside DNA), barrels.
SPACED_UNITS = [
    ('He is 5 ft 10 in tall.', 'He is five feet ten inches tall.'),
    ('He is 6 ft tall.', 'He is six feet tall.'),
    ('He arrived at 10 in the morning.', 'He arrived at ten in the morning.'),
    ('Everest is 8,849 m high.', 'Everest is eight thousand eight hundred and forty nine meters high.'),
    ('I drove 5 m.', 'I drove five m.'),
    ('电流10A。', '电流十安。'),
    ('The charger outputs 10 A.', 'The charger outputs ten amps.'),
    ('5A景区。', '五A景区。'),
    ('He got 10 A grades.', 'He got ten A grades.'),
    ('美联储加息25bp。', '美联储加息二十五个基点。'),
    ('The Fed raised rates by 25 bp.', 'The Fed raised rates by twenty five basis points.'),
    ('DNA片段长500bp。', 'DNA片段长五百个碱基对。'),
    ('原油期货报$78.5/bbl。', '原油期货报七十八点五美元每桶。'),
]

# Numbers that name a day, a service or an event: digit by digit (双 for the same month and day); amounts stay.
NAMED_NUMBERS = [
    ('3.15晚会曝光了很多问题。', '三一五晚会曝光了很多问题。'),
    ('11.11购物节。', '双十一购物节。'),
    ('双11快到了。', '双十一快到了。'),
    ('618大促开始了。', '六一八大促开始了。'),
    ('520表白日。', '五二零表白日。'),
    ('12306网站。', '幺二三零六网站。'),
    ('我买了618个苹果。', '我买了六百一十八个苹果。'),
    ('我有520元。', '我有五百二十元。'),
    ('3.15元。', '三元一角五分。'),
    ('We visited the 9/11 memorial.', 'We visited the nine eleven memorial.'),
    ('9/11事件震惊世界。', '九一一事件震惊世界。'),
    ('We met on 9/11.', 'We met on September eleventh.'),
    ('He lost 9/11 games.', 'He lost nine elevenths games.'),
]

# Identifiers: a flight's number after its airline's code, a train's number before 次, an account's letters.
IDENTIFIERS = [
    ('Flight UA 857 is delayed.', 'Flight UA eight five seven is delayed.'),
    ('乘坐D301次动车。', '乘坐D三零幺次动车。'),
    ('G7次高铁。', 'G七次高铁。'),
    ('我的微信号是abc123。', '我的微信号是abc幺二三。'),
]

# Sections, articles and paragraphs, and how often a dose is taken; the words alone stay words.
LEGAL_AND_DOSES = [
    ('See § 5 of the contract.', 'See section five of the contract.'),
    ('详见§5。', '详见第五节。'),
    ('See Art. 5 and Para. 3.', 'See Article five and Paragraph three.'),
    ('Art is fun. I love Art.', 'Art is fun. I love Art.'),
    ('q8h静脉滴注。', '每八小时一次静脉滴注。'),
    ('Take 2 tablets q8h.', 'Take two tablets every eight hours.'),
    ('Take 1 tablet bid.', 'Take one tablet twice a day.'),
    ('I made a bid of $5.', 'I made a bid of five dollars.'),
]

# Race times with tenths, time ranges with a day part on both sides, dates written day.month.year.
TIMES_AND_DATES = [
    ('She won the 1500m in 3:55.2.',
     'She won the one thousand five hundred meters in three minutes fifty five point two seconds.'),
    ('他的成绩是3:55.21。', '他的成绩是三分五十五点二一秒。'),
    ('The meeting is at 3:55.', 'The meeting is at three fifty five.'),
    ('上午9:00-下午5:30', '上午九点到下午五点三十分'),
    ('早上8:00到晚上10:00营业。', '早上八点到晚上十点营业。'),
    ('05.03.2024开会。', '二零二四年三月五日开会。'),
    ('31.12.2024', '二零二四年十二月三十一日'),
    ('My IP is 1.2.3.4.', 'My IP is one dot two dot three dot four.'),
]


CASES = [*UNITS_BESIDE_UNITS, *MORE_UNITS, *ANGLES, *FEET_INCHES, *POWERS, *CODES, *NO_LIANG, *ENGLISH_ABBREVIATIONS,
         *RESOLUTIONS, *MIXED_NUMBERS, *YEARS, *AM_PM_RANGES, *NAME_DOTS, *SPACED_TIMES, *RATINGS, *SCIENTIFIC,
         *MODEL_NUMBERS, *ADDRESSES, *SPACED_UNITS, *NAMED_NUMBERS, *IDENTIFIERS, *LEGAL_AND_DOSES, *TIMES_AND_DATES]


@pytest.mark.parametrize("library", [True, False])
@pytest.mark.parametrize("text, expected", CASES)
def test_a_replayed_neighbour_reads_as_a_listener_expects(text: str, expected: str, library: bool) -> None:
    result = normalize(text, library=library)
    assert result.text == expected
    assert_read(text, result)
