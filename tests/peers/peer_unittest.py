import unittest


class TestStyle(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.shared = 41

    def setUp(self):
        self.value = 1

    def test_passes(self):
        self.assertEqual(self.shared + self.value, 42)

    def test_fails(self):
        self.assertEqual(1, 2)

    @unittest.skip("not today")
    def test_skipped(self):
        raise AssertionError("never runs")

    @unittest.expectedFailure
    def test_expected_failure(self):
        self.assertEqual(1, 2)

    def test_skip_inside(self):
        self.skipTest("inside")

    def test_in_child_process_when_isolated(self):
        import os
        self.assertTrue(os.getpid() > 0)
